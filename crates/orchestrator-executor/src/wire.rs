//! What the service and the sandbox helper (`orchestrator-sandbox-exec`)
//! say to each other: an attempt's request (its command line and
//! environment), and for a kept sandbox (`kept`) the attempt's streams
//! and the helper's report. Both sides read it from here, so that the
//! format has one definition.

use std::ffi::{OsStr, OsString};
use std::io::{IoSlice, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// The helper's program, a small binary of its own beside `orchestrator`
/// (or in `/usr/libexec/orchestrator/`): started in each prepared
/// sandbox, it must cost little more than the script's own exec.
pub const HELPER_NAME: &str = "orchestrator-sandbox-exec";

/// What the helper leaves in its sandbox's dir once it runs: every mount
/// is made. Taken away before the script starts.
pub(crate) const READY_MARK: &str = ".ready";

/// The largest request the helper reads: a command line and environment.
pub(crate) const MAX_REQUEST_BYTES: usize = 4 << 20;

/// The helper's flag for a kept sandbox, before its dir.
pub(crate) const KEPT_FLAG: &str = "--kept";

/// The helper's flag for a script that starts with its sandbox, before
/// the script's command line.
pub(crate) const EXEC_FLAG: &str = "--exec";

/// The byte sent with an attempt's streams when the kept sandbox ends
/// after it: the helper reports the attempt and exits, without emptying
/// the sandbox for a next attempt that will not come.
pub(crate) const LAST_ATTEMPT: u8 = 1;

/// An attempt's streams, in the order they are passed: the script's
/// stdin (read end), stdout and stderr (write ends).
pub(crate) const STREAMS: usize = 3;

/// What a prepared sandbox is to run.
pub(crate) struct Request<'a> {
    /// The task's work dir, linked inside to the sandbox's own dir.
    pub work_dir: &'a Path,
    pub program: &'a OsStr,
    pub args: Vec<&'a OsStr>,
    /// The service's environment, then the attempt's own variables.
    pub env: [&'a [(OsString, OsString)]; 2],
}

impl Request<'_> {
    /// The bytes the helper reads: a big-endian length, then NUL-ended
    /// fields (no field can hold a NUL: they are paths, arguments and
    /// environment entries).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut fields: Vec<&[u8]> = vec![
            self.work_dir.as_os_str().as_bytes(),
            self.program.as_bytes(),
        ];
        let argc = self.args.len().to_string();
        fields.push(argc.as_bytes());
        fields.extend(self.args.iter().map(|a| a.as_bytes()));
        let entries: Vec<Vec<u8>> = self
            .env
            .iter()
            .flat_map(|part| part.iter())
            .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
            .collect();
        fields.extend(entries.iter().map(Vec::as_slice));
        let body: Vec<u8> = fields.iter().flat_map(|f| [*f, b"\0"].concat()).collect();
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend(body);
        out
    }
}

/// A [`Request`] as the helper reads it.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub work_dir: PathBuf,
    pub program: OsString,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

impl Decoded {
    /// Reads exactly one request's bytes from `input`.
    pub(crate) fn read(input: &mut impl Read) -> Result<Decoded, String> {
        let mut len = [0u8; 4];
        input
            .read_exact(&mut len)
            .map_err(|e| format!("no request: {e}"))?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_REQUEST_BYTES {
            return Err(format!(
                "a request of {len} bytes, above {MAX_REQUEST_BYTES}"
            ));
        }
        let mut body = vec![0u8; len];
        input
            .read_exact(&mut body)
            .map_err(|e| format!("a cut request: {e}"))?;
        let mut fields = body
            .split(|b| *b == 0)
            .map(|f| OsString::from_vec(f.to_vec()));
        let (Some(work_dir), Some(program), Some(argc)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err("a request without its command".into());
        };
        let argc = argc
            .to_str()
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or("a request without its argument count")?;
        let args: Vec<OsString> = fields.by_ref().take(argc).collect();
        let env = fields
            .filter(|entry| !entry.is_empty())
            .filter_map(|entry| {
                let bytes = entry.as_bytes();
                let at = bytes.iter().position(|b| *b == b'=')?;
                Some((
                    OsString::from_vec(bytes[..at].to_vec()),
                    OsString::from_vec(bytes[at + 1..].to_vec()),
                ))
            })
            .collect();
        Ok(Decoded {
            work_dir: PathBuf::from(work_dir),
            program,
            args,
            env,
        })
    }

    /// The request's command line and environment, nothing inherited.
    pub(crate) fn command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }
}

/// What the helper says before it gives up (exit code 127, as a shell's
/// "cannot run").
pub(crate) fn helper_failed(what: &str) -> ExitCode {
    eprintln!("{HELPER_NAME}: {what}");
    ExitCode::from(127)
}

/// Sends one attempt to a kept sandbox's helper: `streams` (see
/// [`STREAMS`]) as ancillary data of one byte, then the request. The byte
/// is [`LAST_ATTEMPT`] when the sandbox serves no attempt after this one,
/// 0 otherwise.
pub(crate) async fn send(
    socket: &mut tokio::net::UnixStream,
    streams: [BorrowedFd<'_>; STREAMS],
    request: &[u8],
    last: bool,
) -> std::io::Result<()> {
    use tokio::io::{AsyncWriteExt, Interest};
    socket
        .async_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(STREAMS))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&streams));
            rustix::net::sendmsg(
                socket.as_fd(),
                &[IoSlice::new(&[if last { LAST_ATTEMPT } else { 0 }])],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .map_err(std::io::Error::from)
        })
        .await?;
    socket.write_all(request).await
}

/// What the helper reports once an attempt ended: its wait status, and
/// whether the sandbox is clean for the next one.
pub(crate) struct Report {
    pub status: ExitStatus,
    pub reusable: bool,
}

impl Report {
    /// Its bytes: the wait status (big-endian), then 1 or 0.
    pub(crate) fn encode(status: i32, reusable: bool) -> [u8; 5] {
        let [a, b, c, d] = status.to_be_bytes();
        [a, b, c, d, u8::from(reusable)]
    }
}

/// The helper's report of the attempt it was given; `None` when the
/// helper is gone.
pub(crate) async fn report(socket: &mut tokio::net::UnixStream) -> Option<Report> {
    use tokio::io::AsyncReadExt;
    let mut raw = [0u8; 5];
    socket.read_exact(&mut raw).await.ok()?;
    let [a, b, c, d, reusable] = raw;
    Some(Report {
        status: ExitStatus::from_raw(i32::from_be_bytes([a, b, c, d])),
        reusable: reusable == 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    #[test]
    fn a_request_is_its_fields_each_ended_by_nul_after_their_length() {
        let env = vec![("A".into(), "x=y".into())];
        let own = vec![("B".into(), "1".into())];
        let request = Request {
            work_dir: Path::new("/d/work/t1"),
            program: OsStr::new("/bin/sh"),
            args: vec![OsStr::new("s.sh")],
            env: [&env, &own],
        };
        let bytes = request.encode();
        let body: Vec<u8> = ["/d/work/t1", "/bin/sh", "1", "s.sh", "A=x=y", "B=1"]
            .iter()
            .flat_map(|field| [field.as_bytes(), b"\0"].concat())
            .collect();
        assert_eq!(&bytes[..4], &(body.len() as u32).to_be_bytes());
        assert_eq!(&bytes[4..], &body[..]);
    }

    #[test]
    fn the_helper_reads_back_the_request_the_service_encodes() {
        let env = vec![("A".into(), "x=y".into())];
        let own = vec![("B".into(), "".into())];
        let request = Request {
            work_dir: Path::new("/d/work/t1"),
            program: OsStr::new("/bin/sh"),
            args: vec![OsStr::new("s.sh"), OsStr::new("")],
            env: [&env, &own],
        };
        let mut bytes = request.encode();
        bytes.extend_from_slice(b"the script's input");
        let mut reader = &bytes[..];
        let decoded = Decoded::read(&mut reader).unwrap();
        assert_eq!(decoded.work_dir, Path::new("/d/work/t1"));
        assert_eq!(decoded.program, "/bin/sh");
        assert_eq!(
            decoded.args,
            vec![OsString::from("s.sh"), OsString::from("")]
        );
        assert_eq!(
            decoded.env,
            vec![("A".into(), "x=y".into()), ("B".into(), "".into())]
        );
        // Exactly the request: what follows is the script's.
        assert_eq!(reader, b"the script's input");
    }

    #[test]
    fn a_request_above_its_limit_or_cut_short_is_refused() {
        let mut too_big: &[u8] = &((MAX_REQUEST_BYTES + 1) as u32).to_be_bytes();
        assert!(Decoded::read(&mut too_big).unwrap_err().contains("above"));
        let mut cut: &[u8] = &[0, 0, 0, 9, b'x'];
        assert!(Decoded::read(&mut cut).unwrap_err().contains("cut"));
    }

    #[tokio::test]
    async fn the_service_reads_the_helpers_report_and_sees_a_gone_helper() {
        let (service, helper) = UnixStream::pair().unwrap();
        service.set_nonblocking(true).unwrap();
        let mut service = tokio::net::UnixStream::from_std(service).unwrap();
        let mut helper = helper;
        helper.write_all(&Report::encode(3 << 8, true)).unwrap();
        helper.write_all(&Report::encode(127 << 8, false)).unwrap();
        drop(helper);
        let first = report(&mut service).await.unwrap();
        assert_eq!((first.status.code(), first.reusable), (Some(3), true));
        let second = report(&mut service).await.unwrap();
        assert_eq!((second.status.code(), second.reusable), (Some(127), false));
        assert!(report(&mut service).await.is_none());
    }
}
