// SPDX-License-Identifier: MIT OR Apache-2.0
//! Real servers that read every request at once and queue it inside, run in a
//! test's namespace: Go's `net/http` (a goroutine per connection waiting for a
//! worker slot, built from `go/readatonce` with Debian's `golang-go`), and
//! nginx proxying to a backend whose workers read when free (nginx reads at
//! once; the queue sits behind it, in the backend). The in-process
//! thread-per-connection server is [`crate::testbed::Service::ReadAtOnce`].
use std::ffi::OsStr;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// A child process killed (and reaped) on drop.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"), PathBuf::from)
}

/// Waits until `addr` (in `ns`) accepts a connection.
pub(crate) fn wait_listening(ns: &str, addr: SocketAddr, what: &str, child: &mut Child) -> io::Result<()> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::other(format!("{what} exited at start: {status}")));
        }
        if crate::testbed::run_in(ns, move || std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)))?
            .is_ok()
        {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(io::Error::other(format!("{what} did not listen on {addr} in 10 s")));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `args` in namespace `ns` (its output discarded) and waits until it
/// listens on `addr`; `what` and `install` name the program and how to get it.
fn spawn_listening(
    ns: &str,
    args: &[&std::ffi::OsStr],
    addr: SocketAddr,
    what: &str,
    install: &str,
) -> io::Result<Process> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| io::Error::other(format!("run {what} ({install}, or cargo xtask setup): {e}")))?;
    wait_listening(ns, addr, what, &mut child)?;
    Ok(Process(child))
}

/// The Go server's binary, built once per process (offline: it needs only
/// the standard library).
fn go_binary() -> io::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("go/readatonce");
            let dir = target_dir().join("testkit-go");
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let out = dir.join("readatonce");
            // Built beside and renamed: test binaries running at once never see half a file.
            let partial = dir.join(format!("readatonce.{}", std::process::id()));
            let status = Command::new("go")
                .args(["build", "-o"])
                .arg(&partial)
                .arg(".")
                .current_dir(&source)
                .env("GOCACHE", dir.join("cache"))
                .env("GOPATH", dir.join("path"))
                .env("GOFLAGS", "-mod=mod")
                .env("GOTOOLCHAIN", "local")
                .env("CGO_ENABLED", "0")
                .status()
                .map_err(|e| format!("run go (apt-get install golang-go, or cargo xtask setup): {e}"))?;
            if !status.success() {
                return Err(format!("go build {}: {status}", source.display()));
            }
            std::fs::rename(&partial, &out).map_err(|e| format!("{}: {e}", out.display()))?;
            Ok(out)
        })
        .clone()
        .map_err(io::Error::other)
}

/// Go's `net/http` with `workers` slots inside, listening on `addr` in a
/// namespace. Stops on drop.
pub struct GoServer {
    _process: Process,
    service_file: tempfile::NamedTempFile,
}

impl GoServer {
    pub fn start(ns: &str, addr: SocketAddr, workers: usize, service_us: u64) -> io::Result<Self> {
        let binary = go_binary()?;
        let service_file = tempfile::NamedTempFile::new()?;
        std::fs::write(service_file.path(), service_us.to_string())?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(&binary)
            .arg(format!("-addr={addr}"))
            .arg(format!("-workers={workers}"))
            .arg(format!("-service-us={service_us}"))
            .arg(format!("-service-file={}", service_file.path().display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        wait_listening(ns, addr, "the Go server", &mut child)?;
        Ok(Self { _process: Process(child), service_file })
    }

    /// A new service time (the server reads it within 50 ms).
    pub fn set_service_us(&self, us: u64) -> io::Result<()> {
        std::fs::write(self.service_file.path(), us.to_string())
    }
}

/// nginx in a namespace, listening on `addr` and proxying every request to
/// `upstream` (a connection per request). Stops on drop.
pub struct Nginx {
    _process: Process,
    _dir: tempfile::TempDir,
}

impl Nginx {
    pub fn start(ns: &str, addr: SocketAddr, upstream: SocketAddr) -> io::Result<Self> {
        Self::start_with_connect_timeout(ns, addr, upstream, 60)
    }

    /// The same, giving up a connection to the upstream after `connect_s`
    /// seconds (nginx's `proxy_connect_timeout`, 60 by default).
    pub fn start_with_connect_timeout(
        ns: &str,
        addr: SocketAddr,
        upstream: SocketAddr,
        connect_s: u32,
    ) -> io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let d = dir.path().display();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\nuser root;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 8192; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             server {{\n    listen {addr} backlog=4096;\n    location / {{\n      proxy_pass http://{upstream};\n\
             proxy_http_version 1.1;\n      proxy_read_timeout 30s;\n      proxy_connect_timeout {connect_s}s;\n    }}\n  }}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf)?;
        let args = [OsStr::new("nginx"), OsStr::new("-p"), dir.path().as_os_str(), OsStr::new("-c"), path.as_os_str()];
        let process = spawn_listening(ns, &args, addr, "nginx", "apt-get install nginx")?;
        Ok(Self { _process: process, _dir: dir })
    }
}

/// gunicorn with its gthread worker (one process, `threads` threads), each
/// request sleeping `service_us`, listening on `addr` in a namespace. Its
/// main thread accepts connections and hands each readable one to a free
/// thread, so requests past the threads wait unread in their sockets, as a
/// Python web service's do. Stops on drop.
pub struct Gunicorn {
    _process: Process,
    _dir: tempfile::TempDir,
}

impl Gunicorn {
    pub fn start(ns: &str, addr: SocketAddr, threads: usize, service_us: u64) -> io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let app = format!(
            "import time\n\ndef app(environ, start_response):\n    time.sleep({})\n    \
             start_response('200 OK', [('Content-Type', 'text/plain'), ('Content-Length', '3')])\n    \
             return [b'OK\\n']\n",
            service_us as f64 / 1e6
        );
        std::fs::write(dir.path().join("shedapp.py"), app)?;
        let (threads, bind) = (format!("--threads={threads}"), format!("--bind={addr}"));
        let args: Vec<&OsStr> =
            ["python3", "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1", &threads, &bind]
                .into_iter()
                .chain(["--backlog", "4096", "--timeout", "120", "--chdir"])
                .map(OsStr::new)
                .chain([dir.path().as_os_str(), OsStr::new("shedapp:app")])
                .collect();
        let process = spawn_listening(ns, &args, addr, "gunicorn", "pip install gunicorn")?;
        Ok(Self { _process: process, _dir: dir })
    }
}

/// HAProxy in front of one server, tuned by hand as a concurrency guard:
/// at most `maxconn` requests at the server, the rest queued in HAProxy for
/// at most `queue_ms` and then answered 503. What an operator who knows the
/// service's workers and latency sets (B14's peer). Stops on drop.
pub struct GuardProxy {
    _process: Process,
    _dir: tempfile::TempDir,
}

impl GuardProxy {
    pub fn start(ns: &str, bind: SocketAddr, server: SocketAddr, maxconn: usize, queue_ms: u64) -> io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let conf = format!(
            "global\n    maxconn 4096\n    nbthread 1\n\
             defaults\n    mode http\n    timeout connect 1s\n    timeout client 10s\n    timeout server 30s\n    \
             timeout queue {queue_ms}ms\n\
             frontend fe\n    bind {bind}\n    default_backend be\n\
             backend be\n    server s1 {server} maxconn {maxconn}\n"
        );
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, conf)?;
        let args = [OsStr::new("haproxy"), OsStr::new("-db"), OsStr::new("-f"), path.as_os_str()];
        let process = spawn_listening(ns, &args, bind, "haproxy", "apt-get install haproxy")?;
        Ok(Self { _process: process, _dir: dir })
    }
}
