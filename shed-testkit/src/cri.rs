// SPDX-License-Identifier: MIT OR Apache-2.0
//! A container runtime of the test's own, driven as the kubelet drives one:
//! a private containerd (its socket, root and state in a temporary folder, a
//! CNI bridge of its own; nothing of the host's containerd is touched), a
//! pause image built here from a static busybox (no registry is reachable),
//! and pod sandboxes made, inspected and removed through the CRI API.
//!
//! What it took to run here is in shared/research/cri.md: `restrict_oom_score_adj`
//! (the pause container asks for an OOM score this sandbox may not set) and
//! cgroupfs rather than systemd.
use std::{
    fs, io,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime},
};

use k8s_cri::v1::{
    ListPodSandboxRequest, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StopPodSandboxRequest,
};
use shed::host::cri::{Client, connect, netns_path};

/// The pause image's name in the runtime.
const PAUSE_IMAGE: &str = "localhost/shed-pause:1";

/// A pod sandbox the runtime made.
#[derive(Clone, Debug)]
pub struct Pod {
    pub id: String,
    /// Its network namespace's name under /run/netns (`--netns` takes it).
    pub netns: String,
    /// Its address on the runtime's bridge.
    pub ip: Ipv4Addr,
}

/// A private containerd. Dropping it removes its pods, stops it and removes
/// its bridge and folder.
pub struct Runtime {
    dir: tempfile::TempDir,
    containerd: Child,
    bridge: String,
    tokio: tokio::runtime::Runtime,
    client: Client,
    socket: PathBuf,
    /// The network namespaces of the pods it made (removed on drop if a pod's removal failed).
    netns: Vec<String>,
}

impl Runtime {
    /// The runtime's CRI socket (`shedctl pods --cri-socket`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Starts containerd with a CNI bridge `bridge` on `subnet` (a /24 such as
    /// `10.233.7.0/24`) and imports the pause image; ready for pods.
    pub fn start(bridge: &str, subnet: &str) -> io::Result<Self> {
        let dir = tempfile::Builder::new().prefix("shed-cri").tempdir()?;
        let root = dir.path();
        for sub in ["root", "state", "cni"] {
            fs::create_dir(root.join(sub))?;
        }
        fs::write(
            root.join("cni/10-shed-test.conflist"),
            format!(
                r#"{{"cniVersion":"0.4.0","name":"shed-test","plugins":[{{"type":"bridge","bridge":"{bridge}","isGateway":true,"ipMasq":false,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"{subnet}"}}]],"dataDir":"{}"}}}},{{"type":"loopback"}}]}}"#,
                root.join("ipam").display()
            ),
        )?;
        let socket = root.join("containerd.sock");
        fs::write(
            root.join("config.toml"),
            format!(
                r#"version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{root}/cni"
"#,
                root = root.display(),
                socket = socket.display(),
            ),
        )?;
        let log = fs::File::create(root.join("containerd.log"))?;
        let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let mut containerd = Command::new("containerd")
            .arg("--config")
            .arg(root.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| io::Error::other(format!("start containerd (cargo xtask setup installs it): {e}")))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        let client = loop {
            match tokio.block_on(connect(&socket)) {
                Ok(client) => break client,
                Err(e) if Instant::now() > deadline => {
                    let _ = containerd.kill();
                    let _ = containerd.wait();
                    let log = fs::read_to_string(root.join("containerd.log")).unwrap_or_default();
                    return Err(io::Error::other(format!("containerd did not answer in 15 s ({e}):\n{log}")));
                }
                Err(_) => thread::sleep(Duration::from_millis(100)),
            }
        };
        // From here on, dropping the runtime cleans up whatever went wrong.
        let mut runtime = Self { dir, containerd, bridge: bridge.to_owned(), tokio, client, socket, netns: Vec::new() };
        runtime.import_pause_image()?;
        Ok(runtime)
    }

    /// The pause image: a static busybox that sleeps, built with podman and
    /// imported into the runtime's `k8s.io` namespace.
    fn import_pause_image(&mut self) -> io::Result<()> {
        let context = self.dir.path().join("pause");
        fs::create_dir(&context)?;
        fs::copy("/bin/busybox", context.join("busybox"))
            .map_err(|e| io::Error::other(format!("copy /bin/busybox (busybox-static): {e}")))?;
        fs::write(
            context.join("Containerfile"),
            "FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT [\"/bin/busybox\", \"sleep\", \"2147483647\"]\n",
        )?;
        let archive = self.dir.path().join("pause.tar");
        // A tag of this runtime's own in podman's store (shared by every process on
        // the host), named as the sandbox image only inside this runtime.
        let build_tag = format!(
            "localhost/shed-pause-{}:1",
            self.dir.path().file_name().and_then(|n| n.to_str()).unwrap_or("x").to_ascii_lowercase()
        );
        run(Command::new("podman").args(["build", "-q", "-t", &build_tag]).arg(&context))?;
        let saved = run(Command::new("podman")
            .args(["save", "-q", "--format", "oci-archive", "-o"])
            .arg(&archive)
            .arg(&build_tag));
        let _ = run(Command::new("podman").args(["rmi", "-f", &build_tag]));
        saved?;
        let ctr = |args: &[&str]| {
            run(Command::new("ctr").arg("--address").arg(&self.socket).args(["-n", "k8s.io"]).args(args))
        };
        ctr(&["images", "import", &archive.display().to_string()])?;
        ctr(&["images", "tag", &build_tag, PAUSE_IMAGE])
    }

    /// Runs a pod sandbox named `name` (in Kubernetes namespace `default`) with
    /// `annotations`, as the kubelet would; returns once it is ready.
    pub fn run_pod(&mut self, name: &str, annotations: &[(&str, &str)]) -> io::Result<Pod> {
        let (pod, _) = self.tokio.block_on(sandbox(self.client.clone(), name, annotations))?;
        self.netns.push(pod.netns.clone());
        Ok(pod)
    }

    /// Runs pod sandboxes `names` at once, every call in flight together (as a
    /// node's pods start after its reboot, or a Deployment scaled up), each
    /// with the moment it was ready (its calls returned).
    pub fn run_pods_together(
        &mut self,
        names: &[String],
        annotations: &[(&str, &str)],
    ) -> io::Result<Vec<(Pod, SystemTime)>> {
        let annotations: Vec<(String, String)> =
            annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let client = self.client.clone();
        let made = self.tokio.block_on(async move {
            let mut calls = tokio::task::JoinSet::new();
            for name in names {
                let (client, name, annotations) = (client.clone(), name.clone(), annotations.clone());
                calls.spawn(async move {
                    let asked: Vec<(&str, &str)> = annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    sandbox(client, &name, &asked).await
                });
            }
            calls.join_all().await
        });
        // Every pod made is the runtime's to clean up, whichever failed.
        let mut pods = Vec::new();
        let mut failed = None;
        for pod in made {
            match pod {
                Ok(pod) => {
                    self.netns.push(pod.0.netns.clone());
                    pods.push(pod);
                }
                Err(e) => failed = Some(e),
            }
        }
        failed.map_or(Ok(pods), Err)
    }

    /// Stops and removes a pod sandbox (its network namespace goes with it).
    pub fn remove_pod(&mut self, id: &str) -> io::Result<()> {
        let pod_sandbox_id = id.to_owned();
        self.tokio
            .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: pod_sandbox_id.clone() }))
            .map_err(|e| io::Error::other(format!("stop pod sandbox {id}: {e}")))?;
        self.tokio
            .block_on(self.client.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id }))
            .map_err(|e| io::Error::other(format!("remove pod sandbox {id}: {e}")))?;
        Ok(())
    }

    /// The ids of the runtime's pod sandboxes.
    pub fn pods(&mut self) -> io::Result<Vec<String>> {
        let list = self
            .tokio
            .block_on(self.client.list_pod_sandbox(ListPodSandboxRequest { filter: None }))
            .map_err(|e| io::Error::other(format!("list pod sandboxes: {e}")))?;
        Ok(list.into_inner().items.into_iter().map(|p| p.id).collect())
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for id in self.pods().unwrap_or_default() {
            let _ = self.remove_pod(&id);
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.containerd.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.containerd.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.containerd.kill();
        let _ = self.containerd.wait();
        // Shims (and their pause processes) outlive containerd by design; ours are
        // the ones given our socket's address.
        let _ = Command::new("pkill").args(["-f", "--"]).arg(format!("-address {}", self.socket.display())).status();
        let _ = crate::testbed::ip(&["link", "del", &self.bridge]);
        for netns in &self.netns {
            if Path::new("/run/netns").join(netns).exists() {
                let _ = crate::testbed::ip(&["netns", "del", netns]);
            }
        }
        // Mounts left under the folder (a rootfs, a shm) would keep it: deepest first.
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| Path::new(m).starts_with(self.dir.path()))
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in under {
            let _ = Command::new("umount").args(["-l", mount]).stderr(Stdio::null()).status();
        }
    }
}

/// Runs a pod sandbox and reads its address and network namespace from its
/// status; with the moment its run call returned (it was ready).
async fn sandbox(mut client: Client, name: &str, annotations: &[(&str, &str)]) -> io::Result<(Pod, SystemTime)> {
    let config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            namespace: "default".to_owned(),
            attempt: 0,
        }),
        annotations: annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..PodSandboxConfig::default()
    };
    let request = RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
    let id = client
        .run_pod_sandbox(request)
        .await
        .map_err(|e| io::Error::other(format!("run pod sandbox {name}: {e}")))?
        .into_inner()
        .pod_sandbox_id;
    let ready = SystemTime::now();
    let status = client
        .pod_sandbox_status(PodSandboxStatusRequest { pod_sandbox_id: id.clone(), verbose: true })
        .await
        .map_err(|e| io::Error::other(format!("status of pod sandbox {name}: {e}")))?
        .into_inner();
    let ip = status
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .and_then(|n| n.ip.parse().ok())
        .ok_or_else(|| io::Error::other(format!("pod {name} has no IPv4 address: {status:?}")))?;
    let netns = status
        .info
        .get("info")
        .and_then(|info| netns_path(info))
        .and_then(|path| Some(path.file_name()?.to_str()?.to_owned()))
        .ok_or_else(|| io::Error::other(format!("pod {name}: no network namespace in its status")))?;
    Ok((Pod { id, netns, ip }, ready))
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output().map_err(|e| io::Error::other(format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr))))
    }
}
