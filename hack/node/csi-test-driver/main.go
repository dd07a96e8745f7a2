// Command csi-test-driver is a TEST CSI driver for the real node of warmcache's test kit
// (pkg/testkit). It is a simulation of the storage behaviours the project's seeds measured on
// real storage (shared file systems such as Weka and OCI File Storage, namespaced block volumes
// such as NVMesh), backed by plain directories and bind mounts on the test machine. It is not a
// storage driver: it keeps test data in a scratch directory and protects nothing.
//
// One process is one driver instance: a CSI driver name, a profile (see profile.go), the CSI
// socket (Identity, Controller and Node services) and, when --registration-dir is given, the
// kubelet plugin-registration socket <registration-dir>/<name>-reg.sock, so no
// node-driver-registrar is needed. The external-provisioner (and, for profiles with attach, the
// external-attacher) talk to the CSI socket.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const vendorVersion = "0.1.0-test"

func main() {
	if err := run(); err != nil {
		log.Printf("csi-test-driver: %v", err)
		os.Exit(1)
	}
}

func run() error {
	name := flag.String("name", "", "CSI driver name (the CSIDriver object's name)")
	profileName := flag.String("profile", "", "storage behaviour to simulate: "+strings.Join(profileNames(), " | "))
	socket := flag.String("csi-socket", "", "path of the CSI unix socket to serve")
	registrationDir := flag.String("registration-dir", "", "the kubelet's plugins_registry directory; empty: do not register with a kubelet")
	stateDir := flag.String("state-dir", "", "directory holding the volumes, their metadata, the attachments and the publish journal")
	nodeID := flag.String("node-id", "", "node id reported by NodeGetInfo (the Node's name)")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)

	profile, ok := profiles[*profileName]
	if !ok {
		return fmt.Errorf("--profile %q: expected one of %s", *profileName, strings.Join(profileNames(), ", "))
	}
	for flagName, v := range map[string]string{"name": *name, "csi-socket": *socket, "state-dir": *stateDir, "node-id": *nodeID} {
		if v == "" {
			return fmt.Errorf("--%s is required", flagName)
		}
	}
	store, err := newStore(*stateDir)
	if err != nil {
		return err
	}

	csiServer := grpc.NewServer(grpc.UnaryInterceptor(logCalls(*name)))
	csi.RegisterIdentityServer(csiServer, &Identity{name: *name, profile: profile})
	csi.RegisterControllerServer(csiServer, &Controller{profile: profile, nodeID: *nodeID, store: store})
	csi.RegisterNodeServer(csiServer, &Node{profile: profile, nodeID: *nodeID, store: store})
	csiListener, err := listenUnix(*socket)
	if err != nil {
		return err
	}
	errs := make(chan error, 2)
	go func() { errs <- csiServer.Serve(csiListener) }()
	log.Printf("driver %s (profile %s, TEST driver) serving CSI on %s", *name, profile.Name, *socket)

	var regServer *grpc.Server
	if *registrationDir != "" {
		regServer = grpc.NewServer(grpc.UnaryInterceptor(logCalls(*name + "/registration")))
		registration.RegisterRegistrationServer(regServer, &Registration{name: *name, endpoint: *socket, failed: errs})
		regPath := filepath.Join(*registrationDir, *name+"-reg.sock")
		regListener, err := listenUnix(regPath)
		if err != nil {
			return err
		}
		go func() { errs <- regServer.Serve(regListener) }()
		log.Printf("plugin registration socket %s", regPath)
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-signals:
		log.Printf("%s: stopping", s)
		if regServer != nil {
			regServer.Stop()
		}
		csiServer.GracefulStop()
		return nil
	case err := <-errs:
		return err
	}
}

// listenUnix removes a stale socket file (a killed predecessor's) and listens on path.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("creating the directory of %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	return l, nil
}

// logCalls logs every call with its request and outcome. Secret values never reach the log:
// a request's secrets (the CSI fields marked csi_secret, all a top-level map "secrets") are
// printed with their entry names only.
func logCalls(prefix string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			log.Printf("%s %s %v -> error: %v", prefix, info.FullMethod, redactSecrets(req), err)
		} else if !strings.HasSuffix(info.FullMethod, "/Probe") {
			log.Printf("%s %s %v -> %v", prefix, info.FullMethod, redactSecrets(req), resp)
		}
		return resp, err
	}
}

// redactSecrets returns msg itself unless it is a generated message with a non-empty Secrets map
// (CreateVolume, DeleteVolume, NodePublishVolume and the other requests that carry secrets);
// then a new message of the same type with every exported field copied and each secret value
// replaced by "(redacted)". The request itself is left untouched.
func redactSecrets(msg any) any {
	v := reflect.ValueOf(msg)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return msg
	}
	src := v.Elem()
	secrets := src.FieldByName("Secrets")
	if !secrets.IsValid() || secrets.Kind() != reflect.Map || secrets.Type().Elem().Kind() != reflect.String || secrets.Len() == 0 {
		return msg
	}
	dst := reflect.New(src.Type()).Elem()
	for i := 0; i < src.NumField(); i++ {
		if src.Type().Field(i).IsExported() {
			dst.Field(i).Set(src.Field(i))
		}
	}
	masked := reflect.MakeMapWithSize(secrets.Type(), secrets.Len())
	redacted := reflect.ValueOf("(redacted)").Convert(secrets.Type().Elem())
	for _, k := range secrets.MapKeys() {
		masked.SetMapIndex(k, redacted)
	}
	dst.FieldByName("Secrets").Set(masked)
	return dst.Addr().Interface()
}

// Identity is the CSI Identity service.
type Identity struct {
	csi.UnimplementedIdentityServer
	name    string
	profile Profile
}

func (i *Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{
		Name:          i.name,
		VendorVersion: vendorVersion,
		Manifest:      map[string]string{"profile": i.profile.Name, "purpose": "test driver (simulation)"},
	}, nil
}

func (i *Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (i *Identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// Registration is the kubelet plugin-registration service (what node-driver-registrar would
// serve): the kubelet finds the socket in plugins_registry, asks GetInfo, and reports whether it
// registered the driver. A refused registration ends the driver, so the test kit sees it.
type Registration struct {
	registration.UnimplementedRegistrationServer
	name     string
	endpoint string
	failed   chan<- error
}

func (r *Registration) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *Registration) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if s.GetPluginRegistered() {
		log.Printf("registered with the kubelet")
	} else {
		select {
		case r.failed <- fmt.Errorf("the kubelet refused the registration: %s", s.GetError()):
		default:
		}
	}
	return &registration.RegistrationStatusResponse{}, nil
}
