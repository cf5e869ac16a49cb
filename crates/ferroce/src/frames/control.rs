//! The sensor bridge's control protocol (hololink.md §5): 32-bit register reads and writes
//! over UDP port 8192, and the data-channel registers that point a bridge's frames at a
//! receiver.
//!
//! A request is 14 bytes, big-endian: command (`0x04` write, `0x14` read), flags (`1` asks
//! for a reply, `2` asks for a sequence check), a 16-bit sequence number, two zero bytes,
//! the address and the value. The reply echoes it with the command's top bit set and a
//! status in byte 4. [`DataChannel`] is the host's side: it programs a device for a
//! [`super::Receiver`] in the order the bridge's host code does. [`DeviceRegisters`] is the
//! device's side, served by `ferroce stream send`: a register map that turns into a
//! [`super::Target`] once a host has programmed it.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::metadata::{ImmediateLayout, METADATA_SIZE};
use super::sender::Target;

/// The device's control port.
pub const CONTROL_PORT: u16 = 8192;

/// Write one 32-bit register.
pub const WR_DWORD: u8 = 0x04;
/// Read one 32-bit register.
pub const RD_DWORD: u8 = 0x14;
/// Request flag: reply to this request.
pub const FLAG_ACK_REQUEST: u8 = 0x01;
/// Request flag: check the sequence number.
pub const FLAG_SEQUENCE_CHECK: u8 = 0x02;

/// Reply status: done.
pub const STATUS_SUCCESS: u8 = 0x00;
/// Reply status: no such register.
pub const STATUS_ADDRESS_ERROR: u8 = 0x03;
/// Reply status: unknown command.
pub const STATUS_COMMAND_ERROR: u8 = 0x04;

/// Data-plane registers, relative to [`hif_base`].
pub mod hif {
    /// Payload bytes per packet, in 128-byte units.
    pub const DP_PACKET_SIZE: u32 = 0x04;
    /// The UDP port data leaves from.
    pub const DP_PACKET_UDP_PORT: u32 = 0x08;
    /// Which virtual ports (sensors) stream: one bit each.
    pub const DP_VP_MASK: u32 = 0x0c;
}

/// Per-sensor (virtual port) registers, relative to [`vp_base`].
pub mod vp {
    /// The receiver's queue pair.
    pub const DP_QP: u32 = 0x00;
    /// The receiver's key.
    pub const DP_RKEY: u32 = 0x04;
    /// Page 0's address, low 32 bits.
    pub const DP_PAGE_LSB: u32 = 0x08;
    /// Page 0's address, high 32 bits.
    pub const DP_PAGE_MSB: u32 = 0x0c;
    /// Bytes from page to page, in 128-byte units.
    pub const DP_PAGE_INC: u32 = 0x10;
    /// Start page in bits 27:16, last page in bits 11:0.
    pub const DP_MAX_BUFF: u32 = 0x14;
    /// Bytes of data per frame.
    pub const DP_BUFFER_LENGTH: u32 = 0x18;
    /// The host's MAC, low 32 bits.
    pub const DP_HOST_MAC_LOW: u32 = 0x20;
    /// The host's MAC, high 16 bits.
    pub const DP_HOST_MAC_HIGH: u32 = 0x24;
    /// The host's IPv4 address.
    pub const DP_HOST_IP: u32 = 0x28;
    /// The host's UDP port (4791); bit 16 turns the metadata packet off.
    pub const DP_HOST_UDP_PORT: u32 = 0x2c;
}

/// The register block of sensor `sensor`'s virtual port.
#[must_use]
pub const fn vp_base(sensor: u32) -> u32 {
    0x1000 + 0x40 * sensor
}

/// The register block of data plane `data_plane`.
#[must_use]
pub const fn hif_base(data_plane: u32) -> u32 {
    0x0200_0300 + 0x1_0000 * data_plane
}

/// Why a control exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The socket failed.
    #[error("control socket: {0}")]
    Io(#[from] io::Error),
    /// No reply after every retry.
    #[error("no reply from {device} to a {what} of register {address:#010x} after {tries} tries")]
    Timeout {
        /// The device.
        device: SocketAddr,
        /// "write" or "read".
        what: &'static str,
        /// The register.
        address: u32,
        /// Requests sent.
        tries: u32,
    },
    /// The device answered with an error status.
    #[error("{device} refused register {address:#010x}: status {status:#04x}")]
    Refused {
        /// The device.
        device: SocketAddr,
        /// The register.
        address: u32,
        /// The status byte.
        status: u8,
    },
    /// The channel cannot be programmed with these values.
    #[error("cannot program the data channel: {0}")]
    Invalid(String),
}

/// One register request or reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// The command (with the top bit set in a reply).
    pub command: u8,
    /// Request flags.
    pub flags: u8,
    /// Sequence number.
    pub sequence: u16,
    /// Status (replies).
    pub status: u8,
    /// Register address.
    pub address: u32,
    /// Value written or read.
    pub value: u32,
}

impl Message {
    /// Bytes on the wire.
    pub const LEN: usize = 14;

    /// Encodes the message.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0; Self::LEN];
        out[0] = self.command;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.sequence.to_be_bytes());
        out[4] = self.status;
        out[6..10].copy_from_slice(&self.address.to_be_bytes());
        out[10..14].copy_from_slice(&self.value.to_be_bytes());
        out
    }

    /// Decodes a message; `None` when it is too short.
    #[must_use]
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let b: &[u8; Self::LEN] = bytes.get(..Self::LEN)?.try_into().ok()?;
        Some(Self {
            command: b[0],
            flags: b[1],
            sequence: u16::from_be_bytes([b[2], b[3]]),
            status: b[4],
            address: u32::from_be_bytes([b[6], b[7], b[8], b[9]]),
            value: u32::from_be_bytes([b[10], b[11], b[12], b[13]]),
        })
    }
}

/// What a host programs into a device's data channel for one receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoceChannel {
    /// The receiver's queue pair ([`super::Receiver::qp_number`]).
    pub qp: u32,
    /// Its key ([`super::Receiver::rkey`]).
    pub rkey: u32,
    /// Page 0's address ([`super::Receiver::external_frame_memory`]).
    pub address: u64,
    /// Bytes of data per frame.
    pub frame_size: usize,
    /// Bytes from page to page.
    pub page_size: usize,
    /// Pages in the ring.
    pub pages: u32,
    /// Payload bytes per packet (a multiple of 128).
    pub payload: usize,
    /// The host's IPv4 address (the receiver's NIC).
    pub host_ip: Ipv4Addr,
    /// The host's MAC (zero on loopback).
    pub host_mac: [u8; 6],
    /// The host's UDP port (4791).
    pub host_port: u16,
}

/// The host's end of a device's control channel, for one sensor's data channel.
#[derive(Debug)]
pub struct DataChannel {
    socket: UdpSocket,
    device: SocketAddr,
    sequence: u16,
    vp: u32,
    hif: u32,
    vp_mask: u32,
    timeout: Duration,
    tries: u32,
}

impl DataChannel {
    /// A channel to the device at `device` (its control port), for sensor 0 on data
    /// plane 0.
    ///
    /// # Errors
    ///
    /// The socket's.
    pub fn new(device: SocketAddr) -> Result<Self, ControlError> {
        let any: IpAddr = if device.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        let socket = UdpSocket::bind(SocketAddr::new(any, 0))?;
        Ok(Self {
            socket,
            device,
            sequence: 0,
            vp: vp_base(0),
            hif: hif_base(0),
            vp_mask: 1,
            timeout: Duration::from_millis(200),
            tries: 5,
        })
    }

    fn exchange(&mut self, command: u8, address: u32, value: u32) -> Result<u32, ControlError> {
        let what = if command == WR_DWORD { "write" } else { "read" };
        self.sequence = self.sequence.wrapping_add(1);
        let request = Message {
            command,
            flags: FLAG_ACK_REQUEST,
            sequence: self.sequence,
            status: 0,
            address,
            value,
        };
        let mut buf = [0u8; 64];
        for _ in 0..self.tries {
            self.socket.send_to(&request.to_bytes(), self.device)?;
            let deadline = Instant::now() + self.timeout;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                self.socket.set_read_timeout(Some(left))?;
                let (n, from) = match self.socket.recv_from(&mut buf) {
                    Ok(r) => r,
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                | io::ErrorKind::ConnectionRefused
                        ) =>
                    {
                        break
                    }
                    Err(e) => return Err(e.into()),
                };
                let Some(reply) = Message::parse(&buf[..n]) else {
                    continue;
                };
                if from != self.device
                    || reply.command != command | 0x80
                    || reply.sequence != self.sequence
                {
                    continue;
                }
                if reply.status != STATUS_SUCCESS {
                    return Err(ControlError::Refused {
                        device: self.device,
                        address,
                        status: reply.status,
                    });
                }
                return Ok(reply.value);
            }
        }
        Err(ControlError::Timeout {
            device: self.device,
            what,
            address,
            tries: self.tries,
        })
    }

    /// Writes a register and waits for the device's acknowledgement.
    ///
    /// # Errors
    ///
    /// [`ControlError::Timeout`] without a reply; [`ControlError::Refused`] for an error
    /// status.
    pub fn write(&mut self, address: u32, value: u32) -> Result<(), ControlError> {
        self.exchange(WR_DWORD, address, value).map(drop)
    }

    /// Reads a register.
    ///
    /// # Errors
    ///
    /// As [`DataChannel::write`].
    pub fn read(&mut self, address: u32) -> Result<u32, ControlError> {
        self.exchange(RD_DWORD, address, 0)
    }

    /// Points the device's frames at a receiver, in the bridge host code's order: stop the
    /// sensor, set the packet size and port, the frame length, the host's MAC, IP and port,
    /// the queue pair and key, the pages, then start the sensor again.
    ///
    /// # Errors
    ///
    /// [`ControlError::Invalid`] for values the registers cannot hold (pages 1 to 4096,
    /// 128-byte multiples, a page large enough for the frame and its metadata); otherwise
    /// those of [`DataChannel::write`].
    pub fn configure_roce(&mut self, c: &RoceChannel) -> Result<(), ControlError> {
        let invalid = |what: String| Err(ControlError::Invalid(what));
        if c.payload == 0 || c.payload % METADATA_SIZE != 0 {
            return invalid(format!("payload {} is not a multiple of 128", c.payload));
        }
        if c.page_size % METADATA_SIZE != 0
            || c.page_size < super::round_up(c.frame_size) + METADATA_SIZE
        {
            return invalid(format!(
                "page size {} must be a multiple of 128 holding the frame ({}) and metadata",
                c.page_size, c.frame_size
            ));
        }
        if !(1..=4096).contains(&c.pages) {
            return invalid(format!("{} pages; 1 to 4096", c.pages));
        }
        let frame = u32::try_from(c.frame_size)
            .map_err(|_| ControlError::Invalid("frame size beyond 32 bits".into()))?;
        let (vp, hif) = (self.vp, self.hif);
        let mask = self.read(hif + hif::DP_VP_MASK).unwrap_or(0);
        self.write(hif + hif::DP_VP_MASK, mask & !self.vp_mask)?;
        self.write(
            hif + hif::DP_PACKET_SIZE,
            (c.payload / METADATA_SIZE) as u32,
        )?;
        self.write(
            hif + hif::DP_PACKET_UDP_PORT,
            super::BRIDGE_DATA_PORT.into(),
        )?;
        self.write(vp + vp::DP_BUFFER_LENGTH, frame)?;
        let m = c.host_mac;
        self.write(
            vp + vp::DP_HOST_MAC_LOW,
            u32::from_be_bytes([m[2], m[3], m[4], m[5]]),
        )?;
        self.write(
            vp + vp::DP_HOST_MAC_HIGH,
            u32::from(u16::from_be_bytes([m[0], m[1]])),
        )?;
        self.write(vp + vp::DP_HOST_IP, u32::from(c.host_ip))?;
        self.write(vp + vp::DP_HOST_UDP_PORT, c.host_port.into())?;
        self.write(vp + vp::DP_QP, c.qp)?;
        self.write(vp + vp::DP_RKEY, c.rkey)?;
        self.write(vp + vp::DP_PAGE_LSB, c.address as u32)?;
        self.write(vp + vp::DP_PAGE_MSB, (c.address >> 32) as u32)?;
        self.write(vp + vp::DP_PAGE_INC, (c.page_size / METADATA_SIZE) as u32)?;
        self.write(vp + vp::DP_MAX_BUFF, c.pages - 1)?;
        self.write(hif + hif::DP_VP_MASK, mask | self.vp_mask)
    }

    /// Stops the sensor and clears its data-channel registers.
    ///
    /// # Errors
    ///
    /// Those of [`DataChannel::write`].
    pub fn unconfigure(&mut self) -> Result<(), ControlError> {
        let (vp, hif) = (self.vp, self.hif);
        let mask = self.read(hif + hif::DP_VP_MASK).unwrap_or(0);
        self.write(hif + hif::DP_VP_MASK, mask & !self.vp_mask)?;
        for reg in [
            vp::DP_QP,
            vp::DP_RKEY,
            vp::DP_PAGE_LSB,
            vp::DP_PAGE_MSB,
            vp::DP_PAGE_INC,
            vp::DP_MAX_BUFF,
            vp::DP_BUFFER_LENGTH,
            vp::DP_HOST_MAC_LOW,
            vp::DP_HOST_MAC_HIGH,
            vp::DP_HOST_IP,
            vp::DP_HOST_UDP_PORT,
        ] {
            self.write(vp + reg, 0)?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Map {
    regs: HashMap<u32, u32>,
    /// Bumped on every write, so a waiter sees each change.
    generation: u64,
}

/// A device's register map, served on its control port by a thread (what `ferroce stream
/// send` runs). It accepts writes and reads of any register in the data-plane and sensor
/// blocks, and describes the data channel as a [`Target`] once a host has programmed it.
#[derive(Debug)]
pub struct DeviceRegisters {
    map: Arc<(Mutex<Map>, Condvar)>,
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

fn known_register(address: u32) -> bool {
    let vp0 = vp_base(0);
    let hif0 = hif_base(0);
    (vp0..vp0 + 0x40 * 16).contains(&address)
        || (hif0..hif0 + 0x10).contains(&address)
        || address == 0x80
}

impl DeviceRegisters {
    /// Serves a register map on `addr` (port [`CONTROL_PORT`] for a real device's place).
    ///
    /// # Errors
    ///
    /// The socket's.
    pub fn serve(addr: SocketAddr) -> io::Result<Self> {
        let socket = UdpSocket::bind(addr)?;
        let addr = socket.local_addr()?;
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let map = Arc::new((Mutex::new(Map::default()), Condvar::new()));
        // The IP version register, as a bridge of HSB IP 0x2603 reports it.
        map.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .regs
            .insert(0x80, 0x2603);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (map, stop) = (Arc::clone(&map), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("ferroce control".into())
                .spawn(move || serve(&socket, &map, &stop))?
        };
        Ok(Self {
            map,
            stop,
            addr,
            thread: Some(thread),
        })
    }

    /// The address served.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A register's value (0 when never written).
    #[must_use]
    pub fn get(&self, address: u32) -> u32 {
        let map = self.map.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.regs.get(&address).copied().unwrap_or(0)
    }

    /// The data channel of sensor 0 as a [`Target`], if a host has programmed it and
    /// enabled the sensor.
    #[must_use]
    pub fn target(&self) -> Option<Target> {
        let map = self.map.0.lock().unwrap_or_else(PoisonError::into_inner);
        target_of(&map.regs)
    }

    /// Waits up to `timeout` for a host to program the channel.
    #[must_use]
    pub fn wait_programmed(&self, timeout: Duration) -> Option<Target> {
        let deadline = Instant::now() + timeout;
        let (lock, cond) = &*self.map;
        let mut map = lock.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(t) = target_of(&map.regs) {
                return Some(t);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            map = cond
                .wait_timeout(map, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Increments on every register write.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.map
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .generation
    }
}

impl Drop for DeviceRegisters {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn target_of(regs: &HashMap<u32, u32>) -> Option<Target> {
    let get = |a: u32| regs.get(&a).copied().unwrap_or(0);
    let (vp0, hif0) = (vp_base(0), hif_base(0));
    let enabled = get(hif0 + hif::DP_VP_MASK) & 1 != 0;
    let ip = get(vp0 + vp::DP_HOST_IP);
    if !enabled || ip == 0 {
        return None;
    }
    let port = get(vp0 + vp::DP_HOST_UDP_PORT) as u16;
    let max_buff = get(vp0 + vp::DP_MAX_BUFF);
    Some(Target {
        dest: SocketAddr::new(Ipv4Addr::from(ip).into(), port),
        qp: get(vp0 + vp::DP_QP) & 0x00ff_ffff,
        rkey: get(vp0 + vp::DP_RKEY),
        address: u64::from(get(vp0 + vp::DP_PAGE_MSB)) << 32
            | u64::from(get(vp0 + vp::DP_PAGE_LSB)),
        page_size: get(vp0 + vp::DP_PAGE_INC) as usize * METADATA_SIZE,
        pages: (max_buff & 0xfff) + 1,
        frame_size: get(vp0 + vp::DP_BUFFER_LENGTH) as usize,
        payload: get(hif0 + hif::DP_PACKET_SIZE) as usize * METADATA_SIZE,
        immediate: ImmediateLayout::Page12,
        fold_metadata: false,
    })
}

fn serve(socket: &UdpSocket, map: &(Mutex<Map>, Condvar), stop: &AtomicBool) {
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::SeqCst) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        // Anything that is not a whole request is ignored, as a device would.
        let Some(request) = Message::parse(&buf[..n]) else {
            continue;
        };
        let mut reply = Message {
            command: request.command | 0x80,
            status: STATUS_SUCCESS,
            ..request
        };
        {
            let mut m = map.0.lock().unwrap_or_else(PoisonError::into_inner);
            match request.command {
                WR_DWORD if known_register(request.address) => {
                    m.regs.insert(request.address, request.value);
                    m.generation += 1;
                    map.1.notify_all();
                }
                RD_DWORD if known_register(request.address) => {
                    reply.value = m.regs.get(&request.address).copied().unwrap_or(0);
                }
                WR_DWORD | RD_DWORD => reply.status = STATUS_ADDRESS_ERROR,
                _ => reply.status = STATUS_COMMAND_ERROR,
            }
        }
        if request.flags & FLAG_ACK_REQUEST != 0 {
            let _ = socket.send_to(&reply.to_bytes(), from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let m = Message {
            command: WR_DWORD,
            flags: FLAG_ACK_REQUEST,
            sequence: 0x1234,
            status: 0,
            address: vp_base(0) + vp::DP_HOST_IP,
            value: 0x7f00_0001,
        };
        let b = m.to_bytes();
        assert_eq!(&b[..4], &[0x04, 0x01, 0x12, 0x34]);
        assert_eq!(&b[6..10], &0x1028u32.to_be_bytes());
        assert_eq!(Message::parse(&b), Some(m));
        assert_eq!(Message::parse(&b[..13]), None);
    }

    #[test]
    fn a_channel_programs_the_register_map() {
        let device = DeviceRegisters::serve("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut channel = DataChannel::new(device.addr()).unwrap();
        assert_eq!(device.target(), None);
        let c = RoceChannel {
            qp: 0x11,
            rkey: 0xabcd_ef01,
            address: 0x7f00_1234_5000,
            frame_size: 1000,
            page_size: 1152,
            pages: 3,
            payload: 1408,
            host_ip: Ipv4Addr::LOCALHOST,
            host_mac: [2, 0, 0, 0, 0, 1],
            host_port: 4791,
        };
        channel.configure_roce(&c).unwrap();
        let t = device.wait_programmed(Duration::from_secs(1)).unwrap();
        assert_eq!(t.dest, "127.0.0.1:4791".parse().unwrap());
        assert_eq!(
            (t.qp, t.rkey, t.address),
            (0x11, 0xabcd_ef01, 0x7f00_1234_5000)
        );
        assert_eq!(
            (t.frame_size, t.page_size, t.pages, t.payload),
            (1000, 1152, 3, 1408)
        );
        assert_eq!(device.get(vp_base(0) + vp::DP_HOST_MAC_LOW), 0x0000_0001);
        assert_eq!(channel.read(0x80).unwrap(), 0x2603);
        assert!(matches!(
            channel.read(0x4000_0000),
            Err(ControlError::Refused {
                status: STATUS_ADDRESS_ERROR,
                ..
            })
        ));
        channel.unconfigure().unwrap();
        assert_eq!(device.target(), None);
    }
}
