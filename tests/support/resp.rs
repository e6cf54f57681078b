//! [`Resp`] / [`RespConn`]: a tiny synchronous RESP2 client for assertions that must not depend
//! on the library under test.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Read/write timeout of the assertion client.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// RESP2 client
// ---------------------------------------------------------------------------

/// A RESP2 reply.
#[derive(Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The integer value; numeric simple/bulk strings are parsed as well.
    /// Panics on anything else.
    pub fn as_int(&self) -> i64 {
        match self {
            Resp::Int(i) => *i,
            Resp::Simple(s) => s
                .parse()
                .unwrap_or_else(|_| panic!("expected integer reply, got {self:?}")),
            Resp::Bulk(Some(b)) => String::from_utf8_lossy(b)
                .parse()
                .unwrap_or_else(|_| panic!("expected integer reply, got {self:?}")),
            other => panic!("expected integer reply, got {other:?}"),
        }
    }

    /// String value: `Some` for simple/bulk strings (lossy UTF-8) and integers,
    /// `None` for nil bulk/array replies. Panics on errors and arrays, so a
    /// failing command shows up with its message.
    pub fn as_str(&self) -> Option<String> {
        match self {
            Resp::Simple(s) => Some(s.clone()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Resp::Int(i) => Some(i.to_string()),
            Resp::Bulk(None) | Resp::Array(None) => None,
            Resp::Error(e) => panic!("expected string reply, got error: {e}"),
            Resp::Array(Some(_)) => panic!("expected string reply, got {self:?}"),
        }
    }

    /// Non-panicking variant of [`as_str`](Self::as_str): `None` for anything
    /// that is not a simple/bulk string or integer.
    pub fn as_str_opt(&self) -> Option<String> {
        match self {
            Resp::Simple(_) | Resp::Bulk(Some(_)) | Resp::Int(_) => self.as_str(),
            _ => None,
        }
    }

    /// Raw bytes of a bulk or simple string; `None` for nil.
    pub fn as_bytes(&self) -> Option<Vec<u8>> {
        match self {
            Resp::Bulk(b) => b.clone(),
            Resp::Simple(s) => Some(s.clone().into_bytes()),
            Resp::Array(None) => None,
            other => panic!("expected bulk string reply, got {other:?}"),
        }
    }

    /// The elements of an array reply (empty for a nil array). Panics otherwise.
    pub fn as_array(&self) -> Vec<Resp> {
        match self {
            Resp::Array(Some(items)) => items.clone(),
            Resp::Array(None) => Vec::new(),
            other => panic!("expected array reply, got {other:?}"),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }

    /// Nil bulk string or nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, Resp::Bulk(None) | Resp::Array(None))
    }

    /// The message of an error reply.
    pub fn error_message(&self) -> Option<&str> {
        match self {
            Resp::Error(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Debug for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resp::Simple(s) => write!(f, "Simple({s:?})"),
            Resp::Error(e) => write!(f, "Error({e:?})"),
            Resp::Int(i) => write!(f, "Int({i})"),
            Resp::Bulk(None) => write!(f, "Bulk(nil)"),
            Resp::Bulk(Some(b)) => match std::str::from_utf8(b) {
                Ok(s) => write!(f, "Bulk({s:?})"),
                Err(_) => write!(f, "Bulk({b:?})"),
            },
            Resp::Array(None) => write!(f, "Array(nil)"),
            Resp::Array(Some(items)) => f.debug_list().entries(items).finish(),
        }
    }
}

/// A persistent synchronous RESP2 connection (useful for MULTI, CLIENT
/// commands or reading pub/sub pushes with [`read_reply`](Self::read_reply)).
pub struct RespConn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl RespConn {
    /// Connect to `127.0.0.1:port` with the default 5 s timeouts.
    pub fn connect(port: u16) -> io::Result<RespConn> {
        Self::connect_timeout(port, CLIENT_TIMEOUT)
    }

    /// Connect with `timeout` used for connecting, reading and writing.
    pub fn connect_timeout(port: u16, timeout: Duration) -> io::Result<RespConn> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(RespConn {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Change the read/write timeout.
    pub fn set_timeout(&mut self, timeout: Duration) -> io::Result<()> {
        self.writer.set_read_timeout(Some(timeout))?;
        self.writer.set_write_timeout(Some(timeout))
    }

    pub fn cmd(&mut self, args: &[&str]) -> io::Result<Resp> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.cmd_bytes(&args)
    }

    pub fn cmd_bytes(&mut self, args: &[&[u8]]) -> io::Result<Resp> {
        self.send_bytes(args)?;
        self.read_reply()
    }

    /// Send a command without reading the reply.
    pub fn send(&mut self, args: &[&str]) -> io::Result<()> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.send_bytes(&args)
    }

    pub fn send_bytes(&mut self, args: &[&[u8]]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        write!(buf, "*{}\r\n", args.len())?;
        for arg in args {
            write!(buf, "${}\r\n", arg.len())?;
            buf.extend_from_slice(arg);
            buf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&buf)?;
        self.writer.flush()
    }

    /// Read the next reply (or pub/sub message).
    pub fn read_reply(&mut self) -> io::Result<Resp> {
        read_resp(&mut self.reader)
    }
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed by redis",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("malformed RESP line {:?}", String::from_utf8_lossy(&line)),
        ));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn parse_len(s: &str) -> io::Result<i64> {
    s.parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP length {s:?}")))
}

fn read_resp(r: &mut impl BufRead) -> io::Result<Resp> {
    let line = read_line(r)?;
    let (kind, rest) = line
        .split_at_checked(1)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "empty RESP line"))?;
    match kind {
        "+" => Ok(Resp::Simple(rest.to_string())),
        "-" => Ok(Resp::Error(rest.to_string())),
        ":" => Ok(Resp::Int(parse_len(rest)?)),
        "$" => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok(Resp::Bulk(None));
            }
            let mut data = vec![0u8; len as usize + 2];
            r.read_exact(&mut data)?;
            if !data.ends_with(b"\r\n") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "bulk string not terminated by CRLF",
                ));
            }
            data.truncate(len as usize);
            Ok(Resp::Bulk(Some(data)))
        }
        "*" => {
            let len = parse_len(rest)?;
            if len < 0 {
                return Ok(Resp::Array(None));
            }
            let mut items = Vec::with_capacity(len as usize);
            for _ in 0..len {
                items.push(read_resp(r)?);
            }
            Ok(Resp::Array(Some(items)))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unsupported RESP reply {line:?}"),
        )),
    }
}
