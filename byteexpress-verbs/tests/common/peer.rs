//! A peer process for cross-process tests: the test binary starts itself again as the peer,
//! which calls back over TCP loopback; both sides then exchange length-prefixed messages.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use byteexpress_verbs::{ConnectAttr, DeviceInfo, Endpoint};

use super::Side;

/// Environment variable naming the peer's role; unset in an ordinary test run.
pub const ROLE: &str = "BX_VERBS_TEST_PEER_ROLE";
/// Environment variable with the port the parent listens on.
const PORT: &str = "BX_VERBS_TEST_PARENT_PORT";

/// Sends one message: u32 LE length, then the bytes.
pub fn put(s: &mut TcpStream, b: &[u8]) {
    s.write_all(&(b.len() as u32).to_le_bytes()).unwrap();
    s.write_all(b).unwrap();
}

/// Receives one message written by [`put`].
pub fn get(s: &mut TcpStream) -> Vec<u8> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n).unwrap();
    let mut b = vec![0u8; u32::from_le_bytes(n) as usize];
    s.read_exact(&mut b).unwrap();
    b
}

/// Starts this test binary again running only the test `entry` with the peer `role`; returns
/// the child and its TCP control connection (reads time out after `wait`).
pub fn spawn_peer(entry: &str, role: &str, wait: Duration) -> (Child, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([entry, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(PORT, port.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    listener.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(wait)).unwrap();
                return (child, s);
            }
            Err(_) if t0.elapsed() < wait => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("peer did not call back: {e}"),
        }
    }
}

/// In the peer: its role and the connection back to the parent; `None` in an ordinary run.
pub fn peer_role() -> Option<(String, TcpStream)> {
    let role = std::env::var(ROLE).ok()?;
    let port: u16 = std::env::var(PORT).unwrap().parse().unwrap();
    Some((role, TcpStream::connect(("127.0.0.1", port)).unwrap()))
}

/// Both sides: exchange endpoints, connect, run `then` (post receives), and wait until both
/// sides did.
/// The soft device passes memory only to a process that took part in a nonce probe with it
/// (DESIGN.md 3.1), as link set-up does: each side expects a nonce, sends it with its device,
/// and probes the other's.
pub fn handshake(s: &mut TcpStream, me: &Side, attr: ConnectAttr, then: impl FnOnce()) {
    let ctx = super::provider();
    let nonce = std::process::id() as u64 ^ 0x5eed_0000_0000;
    ctx.expect_probe(nonce);
    put(s, &ctx.device_info().to_bytes());
    put(s, &nonce.to_le_bytes());
    let peer_dev = DeviceInfo::from_bytes(&get(s)).unwrap();
    let peer_nonce = u64::from_le_bytes(get(s).try_into().unwrap());
    assert!(
        ctx.probe(&peer_dev, peer_nonce).unwrap(),
        "probe of the peer"
    );
    put(s, b"probed");
    assert_eq!(get(s), b"probed");
    put(s, &me.qp.endpoint().to_bytes());
    let peer = Endpoint::from_bytes(&get(s)).unwrap();
    me.qp.connect(&peer, &attr).unwrap();
    then();
    put(s, b"connected");
    assert_eq!(get(s), b"connected");
}
