//! The `echo.Echo` test service (`proto/echo.proto`): echo with metadata, a slow method whose
//! cancelled handlers are counted, and errors with chosen code, message and metadata.
//! The metadata it sends back is the request's custom metadata (ASCII and `-bin`): every entry
//! but the headers gRPC reserves ([`byteexpress::is_reserved_header`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tonic::metadata::{KeyAndValueRef, MetadataMap};
use tonic::{Request, Response, Status};

use byteexpress::{is_reserved_header, served_over};

use crate::pb::echo::echo_server::{self, EchoServer};
use crate::pb::echo::{
    EchoRequest, EchoResponse, FailRequest, SleepRequest, SleepResponse, StatsRequest,
    StatsResponse,
};

/// Longest Sleep accepted, so a test cannot park a handler for ever.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// Counters of Sleep handlers, shared by the clones of one [`EchoService`].
#[derive(Debug, Default)]
struct Counters {
    cancelled: AtomicU64,
    finished: AtomicU64,
}

/// The test service. Clones share their counters.
#[derive(Debug, Clone, Default)]
pub struct EchoService {
    counters: Arc<Counters>,
}

impl EchoService {
    /// The service as a tonic server, ready for `byteexpress::Server::builder` or tonic's own.
    pub fn server(self) -> EchoServer<EchoService> {
        EchoServer::new(self)
    }
}

/// Counts a Sleep handler as finished or, when dropped before that, as cancelled.
struct Probe<'a> {
    counters: &'a Counters,
    done: bool,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        let c = if self.done {
            &self.counters.finished
        } else {
            &self.counters.cancelled
        };
        c.fetch_add(1, Ordering::SeqCst);
    }
}

/// The custom (non-reserved) entries of `from`.
fn custom_metadata(from: &MetadataMap) -> MetadataMap {
    let mut out = MetadataMap::new();
    for kv in from.iter() {
        match kv {
            KeyAndValueRef::Ascii(k, v) if !is_reserved_header(k.as_str()) => {
                out.append(k.clone(), v.clone());
            }
            KeyAndValueRef::Binary(k, v) => {
                out.append_bin(k.clone(), v.clone());
            }
            KeyAndValueRef::Ascii(..) => {}
        }
    }
    out
}

#[tonic::async_trait]
impl echo_server::Echo for EchoService {
    async fn echo(&self, req: Request<EchoRequest>) -> Result<Response<EchoResponse>, Status> {
        let mut md = custom_metadata(req.metadata());
        md.insert(
            "x-served-over",
            served_over(&req)
                .parse()
                .map_err(|_| Status::internal("metadata"))?,
        );
        let mut resp = Response::new(EchoResponse {
            payload: req.into_inner().payload,
        });
        *resp.metadata_mut() = md;
        Ok(resp)
    }

    async fn sleep(&self, req: Request<SleepRequest>) -> Result<Response<SleepResponse>, Status> {
        let d = Duration::from_millis(req.into_inner().millis);
        if d > MAX_SLEEP {
            return Err(Status::invalid_argument(format!(
                "sleep of {d:?} is above {MAX_SLEEP:?}"
            )));
        }
        let mut probe = Probe {
            counters: &self.counters,
            done: false,
        };
        tokio::time::sleep(d).await;
        probe.done = true;
        Ok(Response::new(SleepResponse {}))
    }

    async fn stats(&self, _req: Request<StatsRequest>) -> Result<Response<StatsResponse>, Status> {
        Ok(Response::new(StatsResponse {
            cancelled: self.counters.cancelled.load(Ordering::SeqCst),
            finished: self.counters.finished.load(Ordering::SeqCst),
        }))
    }

    async fn fail(&self, req: Request<FailRequest>) -> Result<Response<EchoResponse>, Status> {
        let md = custom_metadata(req.metadata());
        let FailRequest { code, message } = req.into_inner();
        let code = match tonic::Code::from(code) {
            tonic::Code::Ok => tonic::Code::Unknown,
            c => c,
        };
        Err(Status::with_metadata(code, message, md))
    }
}
