//! [`Routes`]: the services added to a [`crate::Server`], found by the service part of the
//! request path (`/package.Service/Method`). Both protocols of the server dispatch through it.

use foldhash::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use byteexpress_rpc::{Code, Status};
use tower_service::Service;

use crate::grpc_status::status_headers;
use byteexpress_rpc::BoxFuture;

/// A request as tonic-generated servers take it.
pub type HttpRequest = http::Request<tonic::body::Body>;
/// A response as tonic-generated servers give it.
pub type HttpResponse = http::Response<tonic::body::Body>;

type Handler = Arc<dyn Fn(HttpRequest) -> BoxFuture<HttpResponse> + Send + Sync>;

/// Services by name (`tonic::server::NamedService::NAME`, e.g. `ps.ParameterServer`).
/// A `tower::Service` itself: unknown services and malformed paths get a trailers-only
/// UNIMPLEMENTED response, as gRPC servers answer. Cloning shares the table (every call of
/// the server takes a clone).
#[derive(Clone, Default)]
pub struct Routes {
    by_name: Arc<HashMap<String, Handler>>,
}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes")
            .field("services", &self.by_name.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Routes {
    /// Adds (or replaces) the service named `S::NAME`.
    pub fn add<S>(&mut self, svc: S)
    where
        S: Service<HttpRequest, Response = HttpResponse, Error = Infallible>
            + tonic::server::NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        let handler: Handler = Arc::new(move |req| {
            let mut svc = svc.clone();
            Box::pin(async move {
                let ready = futures::future::poll_fn(|cx| svc.poll_ready(cx)).await;
                match ready {
                    Ok(()) => match svc.call(req).await {
                        Ok(r) => r,
                        Err(never) => match never {},
                    },
                    Err(never) => match never {},
                }
            })
        });
        Arc::make_mut(&mut self.by_name).insert(S::NAME.to_string(), handler);
    }

    /// Names of the added services.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// Runs the service the request's path names.
    pub fn dispatch(&self, req: HttpRequest) -> BoxFuture<HttpResponse> {
        let name = service_name(req.uri().path());
        match name.and_then(|n| self.by_name.get(n)) {
            Some(h) => h(req),
            None => {
                let status = Status::new(
                    Code::Unimplemented,
                    format!("no service for path {:?}", req.uri().path()),
                );
                let mut resp = http::Response::new(tonic::body::Body::default());
                *resp.headers_mut() = status_headers(&status);
                Box::pin(std::future::ready(resp))
            }
        }
    }
}

/// `/package.Service/Method` → `package.Service`.
fn service_name(path: &str) -> Option<&str> {
    let (svc, method) = path.strip_prefix('/')?.split_once('/')?;
    (!svc.is_empty() && !method.is_empty() && !method.contains('/')).then_some(svc)
}

impl Service<HttpRequest> for Routes {
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = BoxFuture<Result<HttpResponse, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: HttpRequest) -> Self::Future {
        let fut = self.dispatch(req);
        Box::pin(async move { Ok(fut.await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_from_paths() {
        assert_eq!(
            service_name("/ps.ParameterServer/Pull"),
            Some("ps.ParameterServer")
        );
        for bad in ["", "/", "//Pull", "/ps.P/", "/ps.P", "ps.P/Pull", "/a/b/c"] {
            assert_eq!(service_name(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn unknown_services_are_unimplemented() {
        let routes = Routes::default();
        let req = http::Request::builder()
            .uri("/nope.Nope/X")
            .body(tonic::body::Body::default())
            .unwrap();
        let resp = routes.dispatch(req).await;
        assert_eq!(resp.headers().get("grpc-status").unwrap(), "12");
    }
}
