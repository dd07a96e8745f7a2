//! The real node leaves the host as it was: while it runs, the host's mounts, the sysctls the
//! kubelet would rewrite, iptables and network namespaces are unchanged; after its process is
//! killed with SIGKILL, no process, mount, cgroup or directory of the node or its plane is left.
//!
//! The node runs in a child process (`local-up`), so this binary starts no plane of its own.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use warmcache_testkit::KUBELET_SYSCTLS;

#[derive(Debug, PartialEq, Eq)]
struct HostState {
    mount_points: BTreeSet<String>,
    sysctls: Vec<(String, String)>,
    iptables: Option<String>,
    netns: BTreeSet<String>,
    links: String,
    paths: Vec<(String, bool)>,
}

fn host_state() -> HostState {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mount_points = mountinfo
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .collect();
    let sysctls = KUBELET_SYSCTLS
        .iter()
        .map(|(entry, _)| {
            let value = std::fs::read_to_string(format!("/proc/sys/{entry}")).unwrap();
            ((*entry).to_owned(), value.trim().to_owned())
        })
        .collect();
    // iptables-save with the comment lines (dates) and packet counters dropped.
    let iptables = Command::new("iptables-save").output().ok().map(|out| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| match l.find(" [") {
                Some(i) if l.starts_with(':') => l[..i].to_owned(),
                _ => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    let netns = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .map(|o| {
            // Counters and state flags change; interface names do not.
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_owned()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let paths = [
        "/var/log/containers",
        "/var/log/pods",
        "/var/lib/kubelet",
        "/var/lib/cni",
        "/run/containerd",
        "/etc/cni/net.d",
    ]
    .iter()
    .map(|p| ((*p).to_owned(), Path::new(p).exists()))
    .collect();
    HostState {
        mount_points,
        sysctls,
        iptables,
        netns,
        links,
        paths,
    }
}

/// Pids whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            out.push((pid, cmdline));
        }
    }
    out
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_host_is_left_as_it_was_and_a_killed_node_leaves_nothing() {
    let before = host_state();
    let mut child = Command::new(env!("CARGO_BIN_EXE_local-up"))
        .env("WARMCACHE_CACHE_DIR", tempfile::tempdir().unwrap().keep())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (mut node_dir, mut plane_dir, mut cgroups, mut kubectl) = (None, None, Vec::new(), None);
    for line in stdout.lines() {
        let line = line.unwrap();
        eprintln!("local-up: {line}");
        if let Some(v) = line.strip_prefix("node dir: ") {
            node_dir = Some(PathBuf::from(v));
        } else if let Some(v) = line.strip_prefix("logs: ") {
            plane_dir = Some(PathBuf::from(v));
        } else if let Some(v) = line.strip_prefix("node cgroup: ") {
            cgroups.push(PathBuf::from(v));
        } else if let Some(v) = line.strip_prefix("kubectl: ") {
            kubectl = Some(PathBuf::from(v));
        } else if line.starts_with("ready;") {
            break;
        }
    }
    let node_dir = node_dir.expect("local-up printed no node dir");
    let plane_dir = plane_dir.expect("local-up printed no plane dir");
    assert!(!cgroups.is_empty(), "local-up printed no node cgroup");
    let kubectl = kubectl.expect("local-up printed no kubectl path");

    // The node is up and real: kubectl sees it Ready.
    let out = Command::new(&kubectl)
        .arg(format!(
            "--kubeconfig={}",
            plane_dir.join("kubeconfig").display()
        ))
        .args(["get", "node", "127.0.0.1", "-o"])
        .arg("jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "True",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node_processes = processes_mentioning(&node_dir.display().to_string());
    assert!(
        node_processes.iter().any(|(_, c)| c.contains("kubelet")),
        "{node_processes:?}"
    );
    // The node's mounts live in its own namespace: the host sees none of them.
    assert_eq!(host_state(), before, "the running node changed the host");
    for cgroup in &cgroups {
        assert!(cgroup.is_dir(), "{}", cgroup.display());
    }

    // SIGKILL: no Drop runs; the supervisors and the janitors clean up.
    child.kill().unwrap();
    child.wait().unwrap();
    let dir = node_dir.display().to_string();
    wait_until(
        "the node's processes to exit",
        Duration::from_secs(30),
        || processes_mentioning(&dir).is_empty(),
    );
    wait_until(
        "the node's cgroups to be removed",
        Duration::from_secs(30),
        || cgroups.iter().all(|c| !c.exists()),
    );
    wait_until(
        "the node's and the plane's directories to be removed",
        Duration::from_secs(30),
        || !node_dir.exists() && !plane_dir.exists(),
    );
    let plane = plane_dir.display().to_string();
    wait_until(
        "the plane's processes to exit",
        Duration::from_secs(30),
        || processes_mentioning(&plane).is_empty(),
    );
    assert_eq!(host_state(), before, "the stopped node changed the host");
}
