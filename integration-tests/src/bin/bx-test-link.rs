//! One client link in a process of its own, for tests that count what a link costs a server:
//! `bx-test-link ADDR`. Connects to the `bx-test-server` at ADDR over RDMA (small buffers),
//! serves one Echo call on the link, prints `LINKED <transport>`, and holds the link until its
//! stdin closes (then exits 0). Exits 1, with the error on stderr, if the link or the call
//! fails.

use std::io::Read;
use std::time::Duration;

use byteexpress_rpc::{Client, Config, Request, TransportPref};
use bytes::Bytes;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(addr) = std::env::args().nth(1) else {
        eprintln!("usage: bx-test-link ADDR");
        std::process::exit(2);
    };
    let cfg = Config {
        transport: TransportPref::Rdma,
        grant: 1,
        recv_buf_size: 4096,
        max_chunk: 4096,
        max_send_wr: 4,
        ..Config::default()
    };
    let client = match Client::connect(&addr, &cfg).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bx-test-link: connect {addr}: {e}");
            std::process::exit(1);
        }
    };
    let call = Request {
        method: "/test.Test/Echo".into(),
        body: Bytes::from_static(b"x"),
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    if let Err(e) = client.call(call).await {
        eprintln!("bx-test-link: call: {e}");
        std::process::exit(1);
    }
    println!("LINKED {:?}", client.transport());
    // The runtime keeps serving the link (keepalive answers) while a blocking thread waits
    // for stdin's end.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    })
    .await;
    drop(client);
}
