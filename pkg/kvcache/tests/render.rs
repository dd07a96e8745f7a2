//! Rendering snapshots for V1, V2, V4 and V9, compared field by field with reference section 4,
//! plus the properties the controller relies on (hash ignores nodeSelector, owner references,
//! labels and selectors, HA and fabric variants).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use warmcache_api_kvcache::v1alpha1::KVCacheBackend;
use warmcache_kvcache::names::POD_SPEC_HASH_ANNOTATION;
use warmcache_kvcache::render::{pod_spec_hash, survey_script};
use warmcache_kvcache::vectors::{self, managed, members, tier0, with};
use warmcache_kvcache::{RenderContext, Rendered, from_value, render};

fn backend(value: &Value) -> KVCacheBackend {
    from_value(value.clone()).unwrap()
}

fn rendered(value: &Value) -> Rendered {
    render(&backend(value), &RenderContext::default()).unwrap()
}

fn pod(ds: &DaemonSet) -> &PodSpec {
    ds.spec.template.spec.as_ref().unwrap()
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The env as (name, literal value or `<fieldPath>`), in order.
fn env(c: &Container) -> Vec<(String, String)> {
    c.env
        .iter()
        .flatten()
        .map(|e: &EnvVar| {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => format!("<{}>", from.field_ref.as_ref().unwrap().field_path),
                (None, None) => String::new(),
            };
            (e.name.clone(), value)
        })
        .collect()
}

fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const COMMON_ENV: [(&str, &str); 10] = [
    ("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
    ("MOONCAKE_MASTER", "kvc-leader.gpustack-system.svc:50051"),
    ("MOONCAKE_PROTOCOL", "tcp"),
    ("MOONCAKE_LOCAL_HOSTNAME", "<status.podIP>"),
    ("MC_TE_METRIC", "1"),
    ("AMD_VISIBLE_DEVICES", "void"),
    ("CAMBRICON_VISIBLE_DEVICES", "void"),
    ("IX_VISIBLE_DEVICES", "void"),
    ("MTHREADS_VISIBLE_DEVICES", "void"),
    ("NVIDIA_VISIBLE_DEVICES", "void"),
];

fn leader_args(r: &Rendered) -> Vec<String> {
    let spec = r.leader.spec.template.spec.as_ref().unwrap();
    container(spec, "leader").args.clone().unwrap()
}

#[test]
fn v1_leader_deployment_and_service() {
    let r = rendered(&vectors::v1());
    // Leader flags without offload.
    assert_eq!(
        leader_args(&r),
        [
            "-rpc_port=50051",
            "-metrics_port=9003",
            "-default_kv_lease_ttl=5m",
            "-allocation_strategy=free_ratio_first"
        ]
    );
    let deployment = &r.leader;
    assert_eq!(deployment.metadata.name.as_deref(), Some("kvc-leader"));
    assert_eq!(
        deployment.metadata.namespace.as_deref(),
        Some("gpustack-system")
    );
    let labels = deployment.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["app.kubernetes.io/name"], "kv-cache-backend");
    assert_eq!(labels["app.kubernetes.io/instance"], "kvc");
    assert_eq!(labels["app.kubernetes.io/component"], "leader");
    assert_eq!(
        labels["app.kubernetes.io/part-of"],
        "gpustack-operator-worker"
    );
    let spec = &deployment.spec;
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(
        spec.strategy.as_ref().unwrap().type_.as_deref(),
        Some("Recreate")
    );
    assert_eq!(spec.progress_deadline_seconds, None);
    let selector = spec.selector.match_labels.as_ref().unwrap();
    assert_eq!(selector.len(), 3);
    assert!(!selector.contains_key("app.kubernetes.io/part-of"));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.service_account_name, None);
    let leader = container(pod, "leader");
    assert_eq!(leader.image.as_deref(), Some(vectors::IMAGE));
    assert_eq!(leader.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(
        leader.command.as_deref(),
        Some(&["mooncake_master".to_owned()][..])
    );
    let ports: Vec<(Option<&str>, i32)> = leader
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref(), p.container_port))
        .collect();
    assert_eq!(ports, [(Some("rpc"), 50051), (Some("admin"), 9003)]);
    assert_eq!(leader.env, None, "no env without HA");
    // Requests, and deliberately no limits (see the render module's "Resources").
    let resources = leader.resources.as_ref().unwrap();
    assert_eq!(resources.requests.as_ref().unwrap()["cpu"].0, "100m");
    assert_eq!(resources.requests.as_ref().unwrap()["memory"].0, "256Mi");
    assert_eq!(resources.limits, None);
    // Without HA nothing elects a leader: no account, no token.
    assert!(r.service_accounts.is_empty() && r.roles.is_empty() && r.role_bindings.is_empty());
    let readiness = leader.readiness_probe.as_ref().unwrap();
    let get = readiness.http_get.as_ref().unwrap();
    assert_eq!(get.path.as_deref(), Some("/get_all_segments"));
    assert_eq!(get.port, IntOrString::Int(9003));
    assert_eq!(
        (readiness.period_seconds, readiness.failure_threshold),
        (Some(5), Some(3))
    );
    let liveness = leader.liveness_probe.as_ref().unwrap();
    assert_eq!(
        liveness.http_get.as_ref().unwrap().path.as_deref(),
        Some("/health")
    );
    assert_eq!(
        (liveness.period_seconds, liveness.failure_threshold),
        (Some(10), Some(6))
    );
    assert_eq!(
        leader.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );
    // Restricted Pod Security for the leader.
    let security = leader.security_context.as_ref().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        security.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_owned()][..])
    );
    let pod_security = pod.security_context.as_ref().unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(
        pod_security.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault"
    );

    // Service.
    let service = r.service.spec.as_ref().unwrap();
    assert_eq!(r.service.metadata.name.as_deref(), Some("kvc-leader"));
    assert_eq!(service.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(service.selector.as_ref(), Some(selector));
    let ports: Vec<(Option<&str>, i32, Option<&IntOrString>)> = service
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref(), p.port, p.target_port.as_ref()))
        .collect();
    assert_eq!(
        ports,
        [
            (Some("rpc"), 50051, Some(&IntOrString::String("rpc".into()))),
            (
                Some("admin"),
                9003,
                Some(&IntOrString::String("admin".into()))
            )
        ]
    );
}

#[test]
fn v1_member_daemonset_without_tier() {
    let r = rendered(&vectors::v1());
    assert_eq!(r.members.len(), 1);
    let ds = &r.members[0];
    assert_eq!(ds.metadata.name.as_deref(), Some("kvc-member-0"));
    let spec = &ds.spec;
    assert_eq!(
        spec.update_strategy.as_ref().unwrap().type_.as_deref(),
        Some("OnDelete")
    );
    let selector = spec.selector.match_labels.as_ref().unwrap();
    assert_eq!(selector["app.kubernetes.io/component"], "member-0");
    assert_eq!(selector.len(), 3);
    let pod = pod(ds);
    assert_eq!(pod.node_selector.as_ref().unwrap()["kvcache"], "true");
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirst"));
    assert_eq!(pod.host_network, None);
    assert_eq!(pod.termination_grace_period_seconds, Some(60));
    assert_eq!(pod.init_containers, None);
    assert_eq!(pod.volumes, None);
    let member = container(pod, "member");
    assert_eq!(
        member.command.as_deref(),
        Some(&["mc_store_rest_server".to_owned()][..])
    );
    assert_eq!(
        member.args, None,
        "group 0 keeps the entrypoint's port 8080"
    );
    assert_eq!(member.ports, None, "no data-plane container ports");
    assert_eq!(member.lifecycle, None);
    let mut expected = pairs(&COMMON_ENV);
    expected.push(("MOONCAKE_GLOBAL_SEGMENT_SIZE".into(), "4294967296".into()));
    assert_eq!(
        env(member),
        expected,
        "no MOONCAKE_OFFLOAD_* without a tier"
    );
    let readiness = member.readiness_probe.as_ref().unwrap();
    assert_eq!(
        readiness.tcp_socket.as_ref().unwrap().port,
        IntOrString::Int(8080)
    );
    assert_eq!(
        (readiness.period_seconds, readiness.failure_threshold),
        (Some(5), Some(3))
    );
    let requests = member
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    // The 4Gi segment and the store's default 1 GiB transfer buffer (localBufferSize unset).
    assert_eq!(requests["memory"].0, "5368709120");
    assert_eq!(requests["cpu"].0, "100m");
    assert_eq!(requests.len(), 2);
    // No memory limit: an OOM kill would lose the whole segment.
    assert_eq!(member.resources.as_ref().unwrap().limits, None);
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.service_account_name, None);
    let annotations = ds
        .spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref();
    assert_eq!(annotations.unwrap()[POD_SPEC_HASH_ANNOTATION].len(), 64);
}

fn tier_env(tail: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut expected = pairs(&COMMON_ENV);
    expected.push(("MOONCAKE_GLOBAL_SEGMENT_SIZE".into(), "536870912000".into()));
    expected.extend(pairs(&[
        ("MOONCAKE_OFFLOAD_ENABLED", "true"),
        ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/var/lib/kvcache"),
        ("MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES", "16777216"),
        ("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "64"),
        ("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "4398046511104"),
        ("MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE", "4398046511104"),
        ("MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT", "10000000"),
    ]));
    expected.extend(pairs(tail));
    expected
}

#[test]
fn v2_full_tier() {
    let r = rendered(&vectors::v2());
    assert_eq!(
        leader_args(&r),
        [
            "-rpc_port=50051",
            "-metrics_port=9003",
            "-default_kv_lease_ttl=5m",
            "-allocation_strategy=free_ratio_first",
            "-enable_offload=true",
            "-offload_on_evict=true"
        ]
    );
    let ds = &r.members[0];
    let pod = pod(ds);
    let member = container(pod, "member");
    assert_eq!(
        env(member),
        tier_env(&[
            ("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "lru"),
            (
                "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO",
                "0.90"
            ),
            ("MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO", "0.80"),
        ])
    );
    // Volume local-disk: hostPath of type Directory, mounted at the same path.
    let volumes = pod.volumes.as_ref().unwrap();
    assert_eq!(volumes.len(), 1);
    assert_eq!(volumes[0].name, "local-disk");
    let host = volumes[0].host_path.as_ref().unwrap();
    assert_eq!(host.path, "/var/lib/kvcache");
    assert_eq!(host.type_.as_deref(), Some("Directory"));
    let mount = &member.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (mount.name.as_str(), mount.mount_path.as_str()),
        ("local-disk", "/var/lib/kvcache")
    );
    assert_eq!(mount.read_only, None);
    // Init container local-disk-survey.
    let survey = container(pod, "local-disk-survey");
    assert_eq!(survey.image, member.image);
    let command = survey.command.as_ref().unwrap();
    assert_eq!(command[..2], ["sh".to_owned(), "-c".to_owned()]);
    assert_eq!(command[2], survey_script("/var/lib/kvcache"));
    assert!(command[2].contains("tier='/var/lib/kvcache'"));
    assert!(command[2].contains("entries=%s control=%s"));
    assert!(command[2].contains("> '/dev/termination-log'"));
    assert_eq!(survey.termination_message_policy.as_deref(), Some("File"));
    assert_eq!(
        survey.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    // The survey has small requests and limits: it counts entries in a stream.
    let survey_resources = survey.resources.as_ref().unwrap();
    let quantity = |map: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
                    key: &str| { map.as_ref().unwrap()[key].0.clone() };
    assert_eq!(quantity(&survey_resources.requests, "cpu"), "10m");
    assert_eq!(quantity(&survey_resources.requests, "memory"), "16Mi");
    assert_eq!(quantity(&survey_resources.limits, "cpu"), "100m");
    assert_eq!(quantity(&survey_resources.limits, "memory"), "64Mi");
    assert!(command[2].contains("find \"$tier/.\" ! -name . -prune -print | wc -l"));
    let survey_mount = &survey.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(survey_mount.mount_path, "/var/lib/kvcache");
    assert_eq!(survey_mount.read_only, Some(true));
    // preStop hook and grace.
    let pre_stop = member
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap();
    let hook = pre_stop.exec.as_ref().unwrap().command.as_ref().unwrap();
    assert_eq!(hook[..2], ["python3".to_owned(), "-c".to_owned()]);
    assert!(
        hook[2].contains("http://127.0.0.1:8080/api/unmount_local_disk"),
        "{}",
        hook[2]
    );
    assert!(
        hook[2].contains("\"grace_period_seconds\": 0"),
        "{}",
        hook[2]
    );
    assert!(hook[2].contains("timeout=10"), "{}", hook[2]);
    assert!(hook[2].contains("method=\"POST\""));
    assert_eq!(pod.termination_grace_period_seconds, Some(60));
}

#[test]
fn v4_eviction_disabled() {
    let r = rendered(&vectors::v4());
    let member = container(pod(&r.members[0]), "member");
    assert_eq!(
        env(member),
        tier_env(&[
            ("MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "none"),
            ("MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION", "false"),
        ])
    );
}

#[test]
fn v5_v6_v8_eviction_variants() {
    let names = |value: &Value| -> Vec<String> {
        env(container(pod(&rendered(value).members[0]), "member"))
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    // V5: an empty block renders nothing eviction-related.
    let v5 = names(&with(vectors::v2(), |o| tier0(o)["eviction"] = json!({})));
    assert!(!v5.iter().any(|n| n.contains("EVICTION")), "{v5:?}");
    // V6: the policy alone.
    let v6_value = with(vectors::v2(), |o| {
        tier0(o)["eviction"] = json!({"policy": "FIFO"});
        tier0(o).as_object_mut().unwrap().remove("capacity");
    });
    let v6 = env(container(pod(&rendered(&v6_value).members[0]), "member"));
    assert!(v6.contains(&(
        "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY".into(),
        "fifo".into()
    )));
    assert!(
        !v6.iter()
            .any(|(n, _)| n.contains("WATERMARK") || n.contains("TOTAL_SIZE"))
    );
    // V8: capacity 0 renders no size variables.
    let v8 = names(&with(vectors::v2(), |o| {
        tier0(o)["capacity"] = json!("0");
        tier0(o).as_object_mut().unwrap().remove("eviction");
    }));
    assert!(
        !v8.iter()
            .any(|n| n.contains("SIZE_LIMIT_BYTES") && n.contains("TOTAL")),
        "{v8:?}"
    );
    assert!(!v8.contains(&"MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE".to_owned()));
    assert!(v8.contains(&"MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES".to_owned()));
}

#[test]
fn v9_second_group_with_tier_and_scale_in() {
    let r = rendered(&vectors::v9());
    assert_eq!(r.members.len(), 2);
    let group0 = pod(&r.members[0]);
    assert_eq!(group0.termination_grace_period_seconds, Some(60));
    assert_eq!(container(group0, "member").lifecycle, None);
    let ds1 = &r.members[1];
    assert_eq!(ds1.metadata.name.as_deref(), Some("kvc-member-1"));
    assert_eq!(
        ds1.metadata.labels.as_ref().unwrap()["app.kubernetes.io/component"],
        "member-1"
    );
    let group1 = pod(ds1);
    let member = container(group1, "member");
    assert_eq!(
        member.args.as_deref(),
        Some(&["--port".to_owned(), "8081".to_owned()][..])
    );
    assert_eq!(
        member
            .readiness_probe
            .as_ref()
            .unwrap()
            .tcp_socket
            .as_ref()
            .unwrap()
            .port,
        IntOrString::Int(8081)
    );
    let hook = &member
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap()
        .exec
        .as_ref()
        .unwrap()
        .command
        .as_ref()
        .unwrap()[2];
    assert!(
        hook.contains("http://127.0.0.1:8081/api/unmount_local_disk"),
        "{hook}"
    );
    assert!(hook.contains("\"grace_period_seconds\": 30"), "{hook}");
    assert!(hook.contains("timeout=40"), "{hook}");
    assert_eq!(group1.termination_grace_period_seconds, Some(90));
    assert_eq!(
        group1.node_selector.as_ref().unwrap()["kvcache-disk"],
        "true"
    );
}

#[test]
fn v10_dropping_the_tier_group_drops_the_offload_flags() {
    let v10 = vectors::valid()
        .into_iter()
        .find(|v| v.id == "V10")
        .unwrap();
    let before = leader_args(&rendered(v10.old.as_ref().unwrap()));
    let after = leader_args(&rendered(&v10.new));
    assert!(before.contains(&"-enable_offload=true".to_owned()));
    assert!(!after.iter().any(|a| a.contains("offload")), "{after:?}");
}

#[test]
fn v12_widening_the_node_selector_keeps_the_pod_spec_hash() {
    let hash = |value: &Value| {
        let r = rendered(value);
        let template = &r.members[0].spec.template;
        let annotation = template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap()[POD_SPEC_HASH_ANNOTATION]
            .clone();
        assert_eq!(
            pod_spec_hash(template).unwrap(),
            annotation,
            "the annotation is the template's own hash"
        );
        annotation
    };
    let base = hash(&vectors::v2());
    assert_eq!(
        base,
        hash(&with(vectors::v2(), |o| members(o)[0]["nodeSelector"] = json!({})))
    );
    assert_eq!(
        base,
        hash(&with(vectors::v2(), |o| members(o)[0]["nodeSelector"] =
            json!({"a": "b", "c": "d"})))
    );
    // Anything else in the template moves it (V11 edits restart the members).
    assert_ne!(
        base,
        hash(&with(vectors::v2(), |o| tier0(o)["capacity"] = json!("8Ti")))
    );
    assert_ne!(
        base,
        hash(&with(vectors::v2(), |o| o["spec"]["image"] =
            json!("repo/store:2")))
    );
}

#[test]
fn v14_extra_args_are_rendered_last_and_in_order() {
    let r = rendered(&with(vectors::v2(), |o| {
        managed(o)["leader"]["extraArgs"] = json!(["-default_kv_lease_ttl=10m", "-client_ttl=30"]);
    }));
    let args = leader_args(&r);
    assert_eq!(
        args[args.len() - 2..],
        [
            "-default_kv_lease_ttl=10m".to_owned(),
            "-client_ttl=30".to_owned()
        ]
    );
}

#[test]
fn ha_renders_election_flags_env_and_account() {
    let r = rendered(&with(vectors::v2(), |o| {
        managed(o)["leader"] = json!({"replicas": 3, "highAvailability": {"memberAddressing": "Lease"},
            "allocationStrategy": "Random", "extraEnv": [{"name": "GLOG_v", "value": "1"}]});
    }));
    assert_eq!(
        leader_args(&r),
        [
            "-rpc_port=50051",
            "-metrics_port=9003",
            "-default_kv_lease_ttl=5m",
            "-enable_ha=true",
            "-ha_backend_type=k8s",
            "-ha_backend_connstring=gpustack-system/kvc-leader",
            "-rpc_address=$(KUBERNETES_POD_IP)",
            "-cluster_id=kvc-leader",
            "-allocation_strategy=random",
            "-enable_offload=true",
            "-offload_on_evict=true",
            "-pod_name=$(KUBERNETES_POD_NAME)",
            "-pod_namespace=$(KUBERNETES_POD_NAMESPACE)",
        ]
    );
    let spec = &r.leader.spec;
    assert_eq!(spec.replicas, Some(3));
    let strategy = spec.strategy.as_ref().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.as_ref().unwrap();
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(3)));
    assert_eq!(spec.progress_deadline_seconds, Some(i32::MAX));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some("kvc-leader"));
    assert_eq!(
        env(container(pod, "leader")),
        pairs(&[
            ("KUBERNETES_POD_NAME", "<metadata.name>"),
            ("KUBERNETES_POD_NAMESPACE", "<metadata.namespace>"),
            ("KUBERNETES_POD_IP", "<status.podIP>"),
            ("GLOG_v", "1"),
        ])
    );
    let member_pod = pod_of(&r.members[0]);
    assert_eq!(member_pod.automount_service_account_token, Some(true));
    assert_eq!(
        member_pod.service_account_name.as_deref(),
        Some("kvc-member")
    );

    // What the election needs is rendered with it: leader and member accounts, Roles on the one
    // Lease, and the bindings.
    let names = |metas: Vec<&k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>| {
        metas
            .iter()
            .map(|m| {
                assert_eq!(m.namespace.as_deref(), Some("gpustack-system"));
                m.name.clone().unwrap()
            })
            .collect::<Vec<_>>()
    };
    let both = ["kvc-leader".to_owned(), "kvc-member".to_owned()];
    assert_eq!(
        names(r.service_accounts.iter().map(|a| &a.metadata).collect()),
        both
    );
    assert_eq!(names(r.roles.iter().map(|a| &a.metadata).collect()), both);
    assert_eq!(
        names(r.role_bindings.iter().map(|a| &a.metadata).collect()),
        both
    );
    for account in &r.service_accounts {
        assert_eq!(account.automount_service_account_token, Some(false));
    }
    let rules = |i: usize| {
        r.roles[i]
            .rules
            .as_ref()
            .unwrap()
            .iter()
            .map(|rule| {
                assert_eq!(
                    rule.api_groups.as_deref(),
                    Some(&["coordination.k8s.io".to_owned()][..])
                );
                assert_eq!(rule.resources.as_deref(), Some(&["leases".to_owned()][..]));
                (rule.resource_names.clone(), rule.verbs.join(","))
            })
            .collect::<Vec<_>>()
    };
    let lease = Some(vec!["kvc-leader".to_owned()]);
    assert_eq!(
        rules(0),
        [
            (lease.clone(), "get,list,watch,update,patch".to_owned()),
            (None, "create".to_owned())
        ]
    );
    assert_eq!(rules(1), [(lease, "get,list,watch".to_owned())]);
    for (i, binding) in r.role_bindings.iter().enumerate() {
        assert_eq!(binding.role_ref.kind, "Role");
        assert_eq!(binding.role_ref.name, both[i]);
        let subject = &binding.subjects.as_ref().unwrap()[0];
        assert_eq!(subject.kind, "ServiceAccount");
        assert_eq!(subject.name, both[i]);
        assert_eq!(subject.namespace.as_deref(), Some("gpustack-system"));
    }
    let member_env = env(container(&member_pod, "member"));
    assert_eq!(
        member_env[1],
        (
            "MOONCAKE_MASTER".into(),
            "k8s://gpustack-system/kvc-leader".into()
        )
    );
}

fn pod_of(ds: &DaemonSet) -> PodSpec {
    pod(ds).clone()
}

#[test]
fn ha_with_service_addressing_renders_the_leader_account_only() {
    let r = rendered(&with(vectors::v2(), |o| {
        managed(o)["leader"] = json!({"replicas": 2, "highAvailability": {}});
    }));
    let names: Vec<&str> = r
        .service_accounts
        .iter()
        .map(|a| a.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(names, ["kvc-leader"]);
    assert_eq!(r.roles.len(), 1);
    assert_eq!(r.role_bindings.len(), 1);
    let member_pod = pod(&r.members[0]);
    assert_eq!(member_pod.automount_service_account_token, Some(false));
    assert_eq!(member_pod.service_account_name, None);
    let leader_pod = r.leader.spec.template.spec.as_ref().unwrap();
    assert_eq!(
        leader_pod.service_account_name.as_deref(),
        Some("kvc-leader")
    );
}

#[test]
fn ha_block_with_one_replica_is_not_active() {
    let r = rendered(&with(vectors::v2(), |o| {
        managed(o)["leader"] =
            json!({"replicas": 1, "highAvailability": {"memberAddressing": "Lease"}});
    }));
    assert!(!leader_args(&r).iter().any(|a| a.contains("enable_ha")));
    assert_eq!(r.leader.spec.replicas, Some(1));
    assert!(r.service_accounts.is_empty() && r.roles.is_empty() && r.role_bindings.is_empty());
    let member_env = env(container(pod(&r.members[0]), "member"));
    assert_eq!(member_env[1].1, "kvc-leader.gpustack-system.svc:50051");
}

#[test]
fn a_tier_member_requests_its_segment_and_both_store_buffers() {
    let r = rendered(&vectors::v2());
    let member = container(pod(&r.members[0]), "member");
    let requests = member
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    // 500Gi segment + 1 GiB default transfer buffer + 1.25 GiB offload staging buffer.
    let expected: i64 = 500 * (1 << 30) + (1 << 30) + 1_342_177_280;
    assert_eq!(requests["memory"].0, expected.to_string());
    // extraEnv sizing the staging buffer moves the request with it.
    let r = rendered(&with(vectors::v2(), |o| {
        members(o)[0]["localBufferSize"] = json!("64Mi");
        members(o)[0]["extraEnv"] = json!([
            {"name": "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", "value": "268435456"}
        ]);
    }));
    let member = container(pod(&r.members[0]), "member");
    let expected: i64 = 500 * (1 << 30) + (64 << 20) + (256 << 20);
    assert_eq!(
        member
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["memory"]
            .0,
        expected.to_string()
    );
}

#[test]
fn rdma_group_uses_the_host_network_and_device_limit() {
    let r = rendered(&with(vectors::v2(), |o| {
        members(o)[0]["transport"] = json!({"protocol": "RDMA"});
        members(o)[0]["extraArgs"] = json!(["-device_name=mlx5_0", "--flag"]);
        members(o)[0]["medium"] = json!("VRAM");
        members(o)[0]["localBufferSize"] = json!("1Gi");
        members(o)[0]["securityContext"] =
            json!({"capabilities": {"add": ["NET_RAW", "IPC_LOCK"]}, "runAsUser": 65532});
    }));
    let pod = pod(&r.members[0]);
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    let member = container(pod, "member");
    let caps = member
        .security_context
        .as_ref()
        .unwrap()
        .capabilities
        .as_ref()
        .unwrap();
    assert_eq!(
        caps.add.as_deref(),
        Some(
            &[
                "IPC_LOCK".to_owned(),
                "SYS_RESOURCE".to_owned(),
                "NET_RAW".to_owned()
            ][..]
        )
    );
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_owned()][..]));
    assert_eq!(
        member.security_context.as_ref().unwrap().run_as_user,
        Some(65532)
    );
    assert_eq!(member.security_context.as_ref().unwrap().privileged, None);
    let resources = member.resources.as_ref().unwrap();
    assert_eq!(
        resources.limits.as_ref().unwrap()["device.gpustack.ai/rdma.shared"].0,
        "1"
    );
    // VRAM: the request is the host buffers only (the 1Gi transfer buffer and, with the tier,
    // the 1.25 GiB offload staging buffer), and no visibility variables are voided.
    assert_eq!(
        resources.requests.as_ref().unwrap()["memory"].0,
        "2415919104"
    );
    let names: Vec<String> = env(member).into_iter().map(|(k, _)| k).collect();
    assert!(!names.contains(&"NVIDIA_VISIBLE_DEVICES".to_owned()));
    assert!(names.contains(&"MOONCAKE_LOCAL_BUFFER_SIZE".to_owned()));
    assert_eq!(env(member)[2].1, "rdma");
    assert_eq!(
        member.args.as_deref(),
        Some(
            &[
                "-D".to_owned(),
                "device_name=mlx5_0".to_owned(),
                "-D".to_owned(),
                "flag".to_owned()
            ][..]
        )
    );
    // The survey runs as the member does, without added capabilities.
    let survey = container(pod, "local-disk-survey")
        .security_context
        .as_ref()
        .unwrap();
    assert_eq!(survey.run_as_user, Some(65532));
    assert_eq!(survey.capabilities.as_ref().unwrap().add, None);
}

#[test]
fn protocols_map_to_the_store_vocabulary() {
    for (protocol, expected) in [
        ("Auto", "tcp"),
        ("TCP", "tcp"),
        ("EFA", "efa"),
        ("CANN", "ascend"),
        ("ROCM", "hip"),
        ("MUSA", "musa"),
        ("MACA", "maca"),
    ] {
        let r = rendered(&with(vectors::v1(), |o| {
            o["spec"]["transport"] = json!({"protocol": protocol})
        }));
        let member = container(pod(&r.members[0]), "member");
        assert_eq!(
            env(member)[2],
            ("MOONCAKE_PROTOCOL".into(), expected.into()),
            "{protocol}"
        );
        if protocol == "EFA" {
            let limits = member.resources.as_ref().unwrap().limits.as_ref().unwrap();
            assert_eq!(limits["vpc.amazonaws.com/efa"].0, "1");
        }
    }
}

#[test]
fn owner_reference_only_with_a_uid() {
    let without = rendered(&vectors::v2());
    assert_eq!(without.leader.metadata.owner_references, None);
    let with_uid = rendered(&with(vectors::v2(), |o| {
        o["metadata"]["uid"] = json!("6a3f9f4e-0b1c-4d2e-9f00-123456789abc");
    }));
    for meta in [
        &with_uid.leader.metadata,
        &with_uid.service.metadata,
        &with_uid.members[0].metadata,
    ] {
        let refs = meta.owner_references.as_ref().unwrap();
        assert_eq!(refs.len(), 1);
        assert_eq!(refs[0].api_version, "worker.gpustack.ai/v1alpha1");
        assert_eq!(refs[0].kind, "KVCacheBackend");
        assert_eq!(refs[0].name, "kvc");
        assert_eq!(refs[0].uid, "6a3f9f4e-0b1c-4d2e-9f00-123456789abc");
        assert_eq!(refs[0].controller, Some(true));
        assert_eq!(refs[0].block_owner_deletion, None);
    }
}

#[test]
fn namespace_and_default_image_come_from_the_context() {
    let value = with(vectors::v2(), |o| {
        o["spec"].as_object_mut().unwrap().remove("image");
        members(o)[0]["image"] = json!("repo/member:latest");
    });
    let ctx = RenderContext {
        namespace: "kv".into(),
        default_image: Some("repo/leader:1".into()),
        ..RenderContext::default()
    };
    let r = render(&backend(&value), &ctx).unwrap();
    assert_eq!(r.leader.metadata.namespace.as_deref(), Some("kv"));
    let leader_pod = r.leader.spec.template.spec.as_ref().unwrap();
    assert_eq!(
        container(leader_pod, "leader").image.as_deref(),
        Some("repo/leader:1")
    );
    let member = container(pod(&r.members[0]), "member");
    assert_eq!(member.image.as_deref(), Some("repo/member:latest"));
    assert_eq!(member.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(env(member)[1].1, "kvc-leader.kv.svc:50051");
    assert!(render(&backend(&value), &RenderContext::default()).is_err());
}

#[test]
fn the_yaml_stream_reads_back_as_the_same_objects() {
    let r = rendered(&vectors::v9());
    let text = r.to_yaml_stream().unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    assert_eq!(docs.len(), 4);
    assert_eq!(docs[0]["kind"], "Deployment");
    assert_eq!(docs[0]["apiVersion"], "apps/v1");
    assert_eq!(docs[1]["kind"], "Service");
    assert_eq!(docs[2]["kind"], "DaemonSet");
    assert_eq!(docs[3]["metadata"]["name"], "kvc-member-1");
    assert_eq!(docs[3], serde_json::to_value(&r.members[1]).unwrap());
    assert_eq!(docs[0], serde_json::to_value(&r.leader).unwrap());
}

#[test]
fn the_yaml_stream_puts_the_election_access_first() {
    let r = rendered(&with(vectors::v2(), |o| {
        managed(o)["leader"] =
            json!({"replicas": 2, "highAvailability": {"memberAddressing": "Lease"}});
    }));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&r.to_yaml_stream().unwrap()).unwrap();
    let kinds: Vec<(String, String)> = docs
        .iter()
        .filter(|d| !d.is_null())
        .map(|d| {
            (
                d["kind"].as_str().unwrap().to_owned(),
                d["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("ServiceAccount", "kvc-leader"),
        ("ServiceAccount", "kvc-member"),
        ("Role", "kvc-leader"),
        ("Role", "kvc-member"),
        ("RoleBinding", "kvc-leader"),
        ("RoleBinding", "kvc-member"),
        ("Deployment", "kvc-leader"),
        ("Service", "kvc-leader"),
        ("DaemonSet", "kvc-member-0"),
    ]
    .iter()
    .map(|(k, n)| ((*k).to_owned(), (*n).to_owned()))
    .collect();
    assert_eq!(kinds, expected);
    assert_eq!(docs[2]["apiVersion"], "rbac.authorization.k8s.io/v1");
}

#[test]
fn external_backends_render_nothing() {
    assert!(render(&backend(&vectors::external()), &RenderContext::default()).is_err());
}

#[test]
fn shell_quoting_of_an_awkward_path() {
    let script = survey_script("/mnt/it's here");
    assert!(
        script.starts_with("tier='/mnt/it'\\''s here'\n"),
        "{script}"
    );
}

#[test]
fn rdma_group_with_several_interfaces_requests_dedicated_devices() {
    let limits = |count: Option<i32>, protocol: &str| {
        let r = rendered(&with(vectors::v2(), |o| {
            members(o)[0]["transport"] = json!({"protocol": protocol});
            if let Some(count) = count {
                members(o)[0]["fabricInterfaceCount"] = json!(count);
            }
        }));
        let member = container(pod(&r.members[0]), "member");
        member
            .resources
            .as_ref()
            .unwrap()
            .limits
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect::<Vec<_>>()
    };
    let one = vec![("device.gpustack.ai/rdma.shared".to_owned(), "1".to_owned())];
    assert_eq!(limits(None, "RDMA"), one);
    assert_eq!(limits(Some(1), "RDMA"), one);
    assert_eq!(
        limits(Some(4), "RDMA"),
        vec![("device.gpustack.ai/rdma".to_owned(), "4".to_owned())]
    );
    assert_eq!(
        limits(Some(2), "EFA"),
        vec![("vpc.amazonaws.com/efa".to_owned(), "2".to_owned())]
    );
    assert!(limits(Some(4), "TCP").is_empty());
}

#[test]
fn multi_tenancy_renders_the_tenant_quota_policy() {
    let r = rendered(&with(vectors::v2(), |o| {
        managed(o)["leader"]["multiTenancy"] = json!(true);
    }));
    let args = leader_args(&r);
    let at = args
        .iter()
        .position(|a| a == "-enable_multi_tenants=true")
        .unwrap();
    assert_eq!(
        args[at + 1],
        "-tenant_quota_connector_uri=/var/lib/mooncake/tenant-quota-policy.yaml"
    );
    // After the allocation strategy and before the offload pair.
    assert!(args[at - 1].starts_with("-allocation_strategy="));
    assert_eq!(args[at + 2], "-enable_offload=true");
    let spec = r.leader.spec.template.spec.as_ref().unwrap();
    let volumes = serde_json::to_value(spec.volumes.as_ref().unwrap()).unwrap();
    assert_eq!(
        volumes,
        json!([
            {"name": "tenant-quota-policy", "emptyDir": {}},
            {"name": "tenant-quota-policy-seed", "configMap": {
                "name": "kvc-tenant-quota-policy", "optional": true, "defaultMode": 420}},
        ])
    );
    let leader = container(spec, "leader");
    let mounts = serde_json::to_value(leader.volume_mounts.as_ref().unwrap()).unwrap();
    assert_eq!(
        mounts,
        json!([{"name": "tenant-quota-policy", "mountPath": "/var/lib/mooncake"}])
    );
    let seed = container(spec, "seed-tenant-quota-policy");
    assert_eq!(seed.image, leader.image);
    assert_eq!(seed.command.as_ref().unwrap()[..2], ["sh", "-c"]);
    assert_eq!(
        env(seed),
        vec![
            (
                "POLICY_SEED".to_owned(),
                "/etc/mooncake/tenant-quota-policy/tenant-quota-policy.yaml".to_owned()
            ),
            (
                "POLICY_FILE".to_owned(),
                "/var/lib/mooncake/tenant-quota-policy.yaml".to_owned()
            ),
            (
                "POLICY_EMPTY".to_owned(),
                "version: 1\ntenants: []\n".to_owned()
            ),
        ]
    );
    let seed_mounts = serde_json::to_value(seed.volume_mounts.as_ref().unwrap()).unwrap();
    assert_eq!(
        seed_mounts,
        json!([
            {"name": "tenant-quota-policy", "mountPath": "/var/lib/mooncake"},
            {"name": "tenant-quota-policy-seed", "mountPath": "/etc/mooncake/tenant-quota-policy", "readOnly": true},
        ])
    );
    // Off: none of it.
    let plain = rendered(&vectors::v2());
    let spec = plain.leader.spec.template.spec.as_ref().unwrap();
    assert!(spec.volumes.is_none() && spec.init_containers.is_none());
    assert!(!leader_args(&plain).iter().any(|a| a.contains("tenant")));
}

#[test]
fn a_padded_spec_image_renders_trimmed() {
    let r = rendered(&with(vectors::v2(), |o| {
        o["spec"]["image"] = json!(format!(" {}\n", vectors::IMAGE));
    }));
    let spec = r.leader.spec.template.spec.as_ref().unwrap();
    assert_eq!(
        container(spec, "leader").image.as_deref(),
        Some(vectors::IMAGE)
    );
    assert_eq!(
        container(pod(&r.members[0]), "member").image.as_deref(),
        Some(vectors::IMAGE)
    );
}

#[test]
fn store_image_user_rules_change_only_the_pods_of_matching_images() {
    use warmcache_kvcache::security::ImageUser;
    let value = with(vectors::v2(), |o| {
        members(o)[0]["image"] = json!("registry.example.com/mooncake:dev");
    });
    let restricted = render(&backend(&value), &RenderContext::default()).unwrap();
    let pod_context = |r: &Rendered, member: bool| {
        let spec = if member {
            pod(&r.members[0]).clone()
        } else {
            r.leader.spec.template.spec.clone().unwrap()
        };
        spec.security_context.unwrap()
    };
    for member in [false, true] {
        let c = pod_context(&restricted, member);
        assert_eq!(c.run_as_non_root, Some(true));
        assert_eq!(c.run_as_user, None);
    }

    // A uid for the group's image: its Pod runs as that uid and keeps runAsNonRoot; the leader
    // (the backend's image, which no rule names) is unchanged.
    let uid = RenderContext {
        image_users: vec![
            "registry.example.com/mooncake=1000"
                .parse::<ImageUser>()
                .unwrap(),
        ],
        ..RenderContext::default()
    };
    let r = render(&backend(&value), &uid).unwrap();
    assert_eq!(r.leader, restricted.leader);
    let c = pod_context(&r, true);
    assert_eq!((c.run_as_non_root, c.run_as_user), (Some(true), Some(1000)));
    assert_eq!(
        c.seccomp_profile.as_ref().unwrap().type_,
        "RuntimeDefault",
        "nothing else is relaxed"
    );
    // The member template changed, so its hash did: the members roll onto it.
    assert_ne!(
        r.members[0]
            .spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations,
        restricted.members[0]
            .spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
    );
    let member = container(pod(&r.members[0]), "member");
    let survey = pod(&r.members[0]).init_containers.as_ref().unwrap()[0].clone();
    for c in [member.security_context.clone(), survey.security_context] {
        let c = c.unwrap();
        assert_eq!(c.allow_privilege_escalation, Some(false));
        assert_eq!(
            c.capabilities.unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
    }

    // `image` for every image: no runAsNonRoot anywhere, nothing else relaxed.
    let all = RenderContext {
        image_users: vec!["*=image".parse::<ImageUser>().unwrap()],
        ..RenderContext::default()
    };
    let r = render(&backend(&value), &all).unwrap();
    for member in [false, true] {
        let c = pod_context(&r, member);
        assert_eq!((c.run_as_non_root, c.run_as_user), (None, None));
        assert_eq!(c.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }
    // A group's own securityContext still wins, container by container.
    let own = with(value.clone(), |o| {
        members(o)[0]["securityContext"] = json!({"runAsUser": 4242});
    });
    let r = render(&backend(&own), &all).unwrap();
    assert_eq!(
        container(pod(&r.members[0]), "member")
            .security_context
            .as_ref()
            .unwrap()
            .run_as_user,
        Some(4242)
    );
}
