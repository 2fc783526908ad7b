//! The `ps.ParameterServer` tonic service over a [`Store`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::pb::ps::parameter_server_server::{ParameterServer, ParameterServerServer};
use crate::pb::ps::{PullRequest, PullResponse, PushRequest, PushResponse};
use crate::shard::{ShardError, ShardSpec};
use crate::store::Store;

/// Pull and Push over a shared [`Store`]; bad input is INVALID_ARGUMENT. A service serving
/// one shard of a fleet ([`PsService::serving`]) refuses a call naming a key of another shard
/// with FAILED_PRECONDITION: the request is well formed but this server is the wrong one for
/// it, and sending it again here (or to another replica of this shard) cannot succeed; the
/// client's shard map must change (gRPC's status-code guide: FAILED_PRECONDITION for a
/// request the system's state rejects, not to be retried until that state is fixed).
#[derive(Debug, Clone)]
pub struct PsService {
    store: Arc<Store>,
    shard: Option<ShardSpec>,
    lateness: Option<Arc<Lateness>>,
}

/// A delay before every answer of a service, changeable while it serves (a slow replica for
/// `bx ps bench --fault slow`). Starts at zero. Belongs to the services given it
/// ([`PsService::late`]), nothing else.
#[derive(Debug, Default)]
pub struct Lateness {
    micros: AtomicU64,
}

impl Lateness {
    /// Delays every answer by `delay` from now on (zero: none).
    pub fn set(&self, delay: Duration) {
        self.micros.store(
            delay.as_micros().min(u128::from(u64::MAX)) as u64,
            Ordering::Relaxed,
        );
    }

    /// The delay now.
    pub fn get(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::Relaxed))
    }
}

impl PsService {
    /// The service over `store`, owning every key.
    pub fn new(store: Arc<Store>) -> Self {
        PsService {
            store,
            shard: None,
            lateness: None,
        }
    }

    /// The service serving only the keys of `shard` ([`ShardSpec::owns`]).
    pub fn serving(self, shard: ShardSpec) -> Self {
        PsService {
            shard: Some(shard),
            ..self
        }
    }

    /// The service answering `lateness` late.
    pub fn late(self, lateness: Arc<Lateness>) -> Self {
        PsService {
            lateness: Some(lateness),
            ..self
        }
    }

    /// Waits out the lateness, then checks the keys are this shard's. Errors:
    /// FAILED_PRECONDITION for a foreign key.
    async fn admit(&self, keys: &[u64]) -> Result<(), Status> {
        if let Some(l) = &self.lateness {
            let d = l.get();
            if !d.is_zero() {
                tokio::time::sleep(d).await;
            }
        }
        match self.shard.map(|s| s.check(keys)) {
            Some(Err(e @ ShardError::ForeignKey { .. })) => {
                Err(Status::failed_precondition(e.to_string()))
            }
            Some(Err(e)) => Err(Status::internal(e.to_string())),
            _ => Ok(()),
        }
    }

    /// The service as a tonic server, ready for `byteexpress::Server::builder` or tonic's own.
    pub fn server(self) -> ParameterServerServer<PsService> {
        ParameterServerServer::new(self)
    }
}

#[tonic::async_trait]
impl ParameterServer for PsService {
    async fn pull(&self, req: Request<PullRequest>) -> Result<Response<PullResponse>, Status> {
        let r = req.into_inner();
        self.admit(&r.keys).await?;
        let values = self
            .store
            .pull(&r.table, &r.keys)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(PullResponse {
            dim: self.store.dim() as u32,
            values,
        }))
    }

    async fn push(&self, req: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let r = req.into_inner();
        self.admit(&r.keys).await?;
        self.store
            .push(&r.table, &r.keys, &r.grads, r.lr)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(PushResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::shard::shard_of;

    fn service(shard: u32, of: u32) -> PsService {
        let store = Arc::new(Store::new(2, &["emb".to_string()], 4));
        PsService::new(store).serving(ShardSpec::new(shard, of).unwrap())
    }

    fn pull(keys: Vec<u64>) -> Request<PullRequest> {
        Request::new(PullRequest {
            table: "emb".into(),
            keys,
        })
    }

    #[tokio::test]
    async fn a_shard_refuses_a_foreign_key_with_failed_precondition() {
        let ps = service(0, 2);
        let own: Vec<u64> = (0..50).filter(|&k| shard_of(k, 2) == 0).collect();
        let foreign = (0..50).find(|&k| shard_of(k, 2) == 1).unwrap();
        assert!(ps.pull(pull(own.clone())).await.is_ok());
        let mut mixed = own.clone();
        mixed.push(foreign);
        let e = ps.pull(pull(mixed.clone())).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message()
                .contains(&format!("key {foreign} belongs to shard 1 of 2")),
            "{e:?}"
        );
        let push = Request::new(PushRequest {
            table: "emb".into(),
            keys: vec![foreign],
            grads: vec![0; 8].into(),
            lr: 1.0,
        });
        let e = ps.push(push).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        // nothing of the refused calls reached the store
        assert_eq!(ps.store.rows(), own.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_service_answers_after_its_lateness() {
        let late = Arc::new(Lateness::default());
        let ps =
            PsService::new(Arc::new(Store::new(2, &["emb".to_string()], 4))).late(late.clone());
        let t0 = tokio::time::Instant::now();
        ps.pull(pull(vec![1])).await.unwrap();
        assert_eq!(t0.elapsed(), Duration::ZERO);
        late.set(Duration::from_millis(20));
        ps.pull(pull(vec![1])).await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_millis(20));
    }
}
