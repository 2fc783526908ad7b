//! Streams over a replica set: [`ReplicaSet::open_stream_with`].

use tokio::time::Instant;

use super::{Outstanding, ReplicaSet};
use crate::balance::CallOptions;
use crate::retry::AttemptError;
use std::sync::Arc;

use crate::retry::AttemptInfo;
use crate::stream::client::{DirectReceiver, DirectSender};
use crate::stream::replay::{relayed, replays};
use crate::stream::{OpenStream, RequestSender, ResponseReceiver};
use crate::{Response, Status};

impl ReplicaSet {
    /// Opens a stream ([`Client::open_stream`](crate::Client::open_stream)) on an endpoint
    /// picked by the set's [`Policy`](crate::Policy) among the ready, admitted ones, waiting
    /// for one as [`ReplicaSet::call_with`] does (`req.timeout` bounds the wait and the whole
    /// stream). The stream stays on that endpoint and counts as outstanding there until it
    /// ends; its status and its length (open to end) are recorded as a call's are (outlier
    /// detection, as gRPC's A50 counts every RPC; the P2C latency estimate, which a long
    /// stream raises). Errors: as [`ReplicaSet::call_with`] before the stream opens.
    ///
    /// With a [`ServiceConfig`](crate::ServiceConfig) attached
    /// ([`ReplicaSet::with_service_config`]), a stream is retried or hedged as a call, each
    /// attempt on an endpoint not tried yet when one is ready, until it commits (the server's
    /// headers, first message or end; waited for here when the request is complete at open,
    /// `half_close`); the request messages of other streams are kept and sent to every
    /// attempt until then (`crate::retry`, "Streams").
    pub async fn open_stream_with(
        &self,
        req: OpenStream,
        opts: CallOptions,
    ) -> Result<(RequestSender, ResponseReceiver), Status> {
        let retry = self.retrier();
        let plan = retry.plan(&req.method, req.timeout, opts.wait_for_ready);
        let opts = CallOptions {
            wait_for_ready: Some(plan.wait_for_ready),
        };
        let tried = Arc::new(parking_lot::Mutex::new(Vec::new()));
        if replays(&retry, &req) {
            let (set, r) = (self.clone(), req.clone());
            return Ok(relayed(retry, req, plan.deadline, move |info| {
                let (set, r, tried) = (set.clone(), r.clone(), tried.clone());
                async move { set.open_attempt(&r, info, opts, &tried).await }
            }));
        }
        let (tx, rx) = retry
            .run(&req.method, plan.deadline, |info| {
                let (req, tried) = (&req, &tried);
                async move {
                    let (tx, mut rx) = self.open_attempt(req, info, opts, tried).await?;
                    if req.half_close {
                        rx.commit_point().await?;
                    }
                    Ok((tx, rx))
                }
            })
            .await?;
        Ok((RequestSender::direct(tx), ResponseReceiver::direct(rx)))
    }

    /// One attempt of a stream: an endpoint not in `tried` when one is ready, the stream
    /// opened on it and recorded there at its end.
    async fn open_attempt(
        &self,
        req: &OpenStream,
        info: AttemptInfo,
        opts: CallOptions,
        tried: &parking_lot::Mutex<Vec<u64>>,
    ) -> Result<(DirectSender, DirectReceiver), AttemptError> {
        let core = &self.h.core;
        let (ep, client) = self.pick_untried(info.deadline, opts, tried).await?;
        // `pick` counted it outstanding: until the stream ends
        let out = Outstanding(&ep);
        let t0 = Instant::now();
        let (tx, mut rx) = match client.open_stream_once(req, info).await {
            Ok(s) => s,
            Err(e) => {
                core.record(&ep, &Err(e.status.clone()), t0.elapsed());
                return Err(e);
            }
        };
        std::mem::forget(out);
        let core = core.clone();
        rx.set_on_end(Box::new(move |res| {
            drop(Outstanding(&ep));
            let res = res.map(|()| Response::default());
            core.record(&ep, &res, t0.elapsed());
        }));
        Ok((tx, rx))
    }
}
