//! Streams over a replica set: [`ReplicaSet::open_stream_with`].

use tokio::time::Instant;

use super::{Outstanding, ReplicaSet};
use crate::balance::CallOptions;
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
    pub async fn open_stream_with(
        &self,
        mut req: OpenStream,
        opts: CallOptions,
    ) -> Result<(RequestSender, ResponseReceiver), Status> {
        let core = &self.h.core;
        let (ep, client, left) = self.ready_endpoint(req.timeout, opts).await?;
        req.timeout = left;
        // `pick` counted it outstanding: until the stream ends
        let out = Outstanding(&ep);
        let t0 = Instant::now();
        let (tx, mut rx) = match client.open_stream(req).await {
            Ok(s) => s,
            Err(e) => {
                core.record(&ep, &Err(e.clone()), t0.elapsed());
                return Err(e);
            }
        };
        std::mem::forget(out);
        let core = self.h.core.clone();
        rx.set_on_end(Box::new(move |res| {
            drop(Outstanding(&ep));
            let res = res.map(|()| Response::default());
            core.record(&ep, &res, t0.elapsed());
        }));
        Ok((tx, rx))
    }
}
