# Sourced by the scripts that build Kubernetes commands from a pinned module
# (hack/build-control-plane.sh, hack/build-node.sh, hack/build-oldest-apiserver.sh).

# kube_version GO_MOD: the k8s.io/kubernetes version the module requires.
kube_version() {
  local version
  version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$1")
  [ -n "$version" ] || { echo "kube_version: $1 requires no k8s.io/kubernetes" >&2; return 1; }
  echo "$version"
}

# kube_ldflags GO_MOD: the linker flags that stamp that version into the binary (what `--version`
# and the API server's /version report; a module build would otherwise say v0.0.0).
kube_ldflags() {
  local version minor
  version=$(kube_version "$1") || return 1
  minor=${version#v1.}; minor=${minor%%.*}
  echo "-s -w \
 -X k8s.io/component-base/version.gitVersion=$version \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
}
