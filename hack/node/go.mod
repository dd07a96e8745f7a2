// Module of the real test node's own Go programs: the TEST CSI driver (csi-test-driver/) and
// the pod sandbox process (pause/). Built by hack/build-node.sh. Versions follow the pinned
// Kubernetes module (hack/controlplane/kube), so a machine that built the control plane has
// every module already.
module warmcache.local/hack/node

go 1.26.0

require (
	github.com/container-storage-interface/spec v1.9.0
	golang.org/x/sys v0.40.0
	google.golang.org/grpc v1.79.3
	k8s.io/kubelet v0.36.3
)

require (
	github.com/golang/protobuf v1.5.4 // indirect
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260128011058-8636f8732409 // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
)
