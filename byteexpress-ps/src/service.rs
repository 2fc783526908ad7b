//! The `ps.ParameterServer` tonic service over a [`Store`].

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::pb::ps::parameter_server_server::{ParameterServer, ParameterServerServer};
use crate::pb::ps::{PullRequest, PullResponse, PushRequest, PushResponse};
use crate::store::Store;

/// Pull and Push over a shared [`Store`]; bad input is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct PsService {
    store: Arc<Store>,
}

impl PsService {
    /// The service over `store`.
    pub fn new(store: Arc<Store>) -> Self {
        PsService { store }
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
        self.store
            .push(&r.table, &r.keys, &r.grads, r.lr)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(PushResponse {}))
    }
}
