//! The watchdog that keeps the out-of-band connection alive once the channel is established.
//!
//! From then on the connection carries only single bytes: `h` (heartbeat, every
//! [`heartbeat`] interval) and `b` (bye, sent by `stop`). A peer is gone when it says bye,
//! when its connection closes (its process ended) or when it stays silent longer than the
//! peer timeout (its host or network went away).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::handshake::io_error;
use super::types::SessionError;

const HEARTBEAT: u8 = b'h';
const BYE: u8 = b'b';

/// How often a side says it is alive, for a peer timeout of `peer_timeout`.
pub(super) fn heartbeat(peer_timeout: Duration) -> Duration {
    (peer_timeout / 4).clamp(Duration::from_millis(1), Duration::from_millis(100))
}

/// Whether the peer is still there, as the watchdog sees it.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    gone: AtomicBool,
    reason: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Liveness {
    /// Why the peer is gone, if it is (cheap when it is not).
    pub(super) fn gone(&self) -> Option<String> {
        if !self.gone.load(Ordering::Acquire) {
            return None;
        }
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn mark_gone(&self, reason: String) {
        let mut slot = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(reason);
        }
        drop(slot);
        self.gone.store(true, Ordering::Release);
    }
}

/// The watchdog thread and what it watches.
#[derive(Debug)]
pub(super) struct Watchdog {
    liveness: Arc<Liveness>,
    stream: TcpStream,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts heartbeats on `stream` (whose hello and exchanges are over).
    pub(super) fn start(stream: TcpStream, peer_timeout: Duration) -> Result<Self, SessionError> {
        let liveness = Arc::new(Liveness::default());
        let beat = heartbeat(peer_timeout);
        let mut theirs = stream
            .try_clone()
            .map_err(io_error("starting the watchdog"))?;
        theirs
            .set_read_timeout(Some(beat))
            .map_err(io_error("starting the watchdog"))?;
        let watched = Arc::clone(&liveness);
        let thread = std::thread::Builder::new()
            .name("ferroce session watchdog".into())
            .spawn(move || watch(&mut theirs, &watched, beat, peer_timeout))
            .map_err(io_error("starting the watchdog"))?;
        Ok(Self {
            liveness,
            stream,
            thread: Some(thread),
        })
    }

    /// What the watchdog knows.
    pub(super) fn liveness(&self) -> &Arc<Liveness> {
        &self.liveness
    }

    /// Says bye to the peer, stops the thread and closes the connection. Idempotent.
    pub(super) fn stop(&mut self) {
        self.liveness.stop.store(true, Ordering::SeqCst);
        // Wakes the thread out of its read at once.
        let _ = self.stream.shutdown(Shutdown::Read);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn watch(stream: &mut TcpStream, liveness: &Liveness, beat: Duration, peer_timeout: Duration) {
    let mut last_heard = Instant::now();
    let mut last_sent: Option<Instant> = None;
    let mut buf = [0u8; 64];
    loop {
        if liveness.stop.load(Ordering::SeqCst) {
            let _ = stream.write_all(&[BYE]);
            return;
        }
        let now = Instant::now();
        if last_sent.is_none_or(|t| now.duration_since(t) >= beat) {
            if let Err(e) = stream.write_all(&[HEARTBEAT]) {
                liveness.mark_gone(format!("the out-of-band connection failed ({e})"));
                return;
            }
            last_sent = Some(now);
        }
        match stream.read(&mut buf) {
            Ok(0) => {
                if !liveness.stop.load(Ordering::SeqCst) {
                    liveness.mark_gone("the peer closed the out-of-band connection".into());
                    return;
                }
            }
            Ok(n) => {
                last_heard = Instant::now();
                if buf[..n].contains(&BYE) {
                    liveness.mark_gone("the peer stopped".into());
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                if !liveness.stop.load(Ordering::SeqCst) {
                    liveness.mark_gone(format!("the out-of-band connection failed ({e})"));
                    return;
                }
            }
        }
        if last_heard.elapsed() > peer_timeout {
            liveness.mark_gone(format!(
                "the peer has been silent for more than {} ms",
                peer_timeout.as_millis()
            ));
            return;
        }
    }
}
