package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	testKey  = "0123456789abcdef0123456789abcdef-the-right-key"
	otherKey = "fedcba9876543210fedcba9876543210-another-key"
)

func newTestStore(t *testing.T) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	store, err := newStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return store, dir
}

func createRequest(name string, secrets map[string]string) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		VolumeCapabilities: []*csi.VolumeCapability{capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		Parameters:         map[string]string{paramPVCNamespace: "team-a"},
		Secrets:            secrets,
	}
}

func message(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return fmt.Sprint(err)
}

// assertNoSecret fails if text contains any of the secret values.
func assertNoSecret(t *testing.T, what, text string, values ...string) {
	t.Helper()
	for _, v := range values {
		if strings.Contains(text, v) {
			t.Fatalf("%s contains a secret value: %s", what, text)
		}
	}
}

func TestOnlyTheBlockProfileEncrypts(t *testing.T) {
	for name, p := range profiles {
		if p.Encryption != (name == "namespaced-block") {
			t.Errorf("profile %s: Encryption=%t", name, p.Encryption)
		}
	}
}

func TestEncryptedCreateRecordsDigestNotKey(t *testing.T) {
	store, dir := newTestStore(t)
	c := &Controller{profile: profiles["namespaced-block"], nodeID: "n1", store: store}
	resp, err := c.CreateVolume(context.Background(), createRequest("pvc-1", map[string]string{"key": testKey}))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVolume().GetVolumeId() != "pvc-1:team-a" {
		t.Fatalf("handle %q", resp.GetVolume().GetVolumeId())
	}
	meta, err := store.readMeta("pvc-1")
	if err != nil || meta == nil {
		t.Fatalf("meta %v %v", meta, err)
	}
	sum := sha256.Sum256([]byte(testKey))
	if meta.KeySHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("recorded digest %q", meta.KeySHA256)
	}
	raw, err := os.ReadFile(store.metaPath("pvc-1"))
	if err != nil || !bytes.Contains(raw, []byte(`"keySha256": "`+meta.KeySHA256+`"`)) {
		t.Fatalf("state file lacks keySha256: %s %v", raw, err)
	}
	// No file of the state directory holds the key.
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(data, []byte(testKey)) {
			t.Errorf("%s holds the key", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// An idempotent retry with the same key succeeds.
	if _, err := c.CreateVolume(context.Background(), createRequest("pvc-1", map[string]string{"key": testKey})); err != nil {
		t.Fatalf("idempotent retry: %v", err)
	}
}

func TestUnencryptedCreateIsUnchanged(t *testing.T) {
	store, _ := newTestStore(t)
	c := &Controller{profile: profiles["namespaced-block"], nodeID: "n1", store: store}
	for _, secrets := range []map[string]string{nil, {}} {
		if _, err := c.CreateVolume(context.Background(), createRequest("pvc-1", secrets)); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(store.metaPath("pvc-1"))
	if err != nil || bytes.Contains(raw, []byte("keySha256")) {
		t.Fatalf("unencrypted volume's state: %s %v", raw, err)
	}
	// Profiles without encryption ignore every secret.
	shared := &Controller{profile: profiles["shared-fs"], nodeID: "n1", store: store}
	req := createRequest("pvc-2", map[string]string{"key": "short", "anything": "else"})
	req.VolumeCapabilities = []*csi.VolumeCapability{capability(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}
	if _, err := shared.CreateVolume(context.Background(), req); err != nil {
		t.Fatalf("shared-fs refused secrets: %v", err)
	}
	if meta, _ := store.readMeta("pvc-2"); meta == nil || meta.KeySHA256 != "" {
		t.Fatalf("shared-fs volume: %+v", meta)
	}
}

func TestCreateRefusesBadSecrets(t *testing.T) {
	store, _ := newTestStore(t)
	c := &Controller{profile: profiles["namespaced-block"], nodeID: "n1", store: store}
	cases := []struct {
		secrets map[string]string
		want    string
	}{
		{map[string]string{"key": "0123456789abcdef0123456789abcde"}, `provisioner secret entry "key" is shorter than 32 characters`},
		{map[string]string{"key": ""}, `provisioner secret entry "key" is shorter than 32 characters`},
		{map[string]string{"key": testKey, "zeta": "zeta-secret-value", "alpha": "alpha-secret-value"}, `provisioner secret entries "alpha", "zeta" are not known`},
		{map[string]string{"passphrase": "passphrase-secret-value"}, `provisioner secret entries "passphrase" are not known`},
	}
	for i, tc := range cases {
		_, err := c.CreateVolume(context.Background(), createRequest("pvc-1", tc.secrets))
		if code(err) != codes.InvalidArgument || !strings.Contains(message(err), tc.want) {
			t.Errorf("case %d: want InvalidArgument %q, got %v", i, tc.want, err)
			continue
		}
		values := []string{}
		for _, v := range tc.secrets {
			if v != "" {
				values = append(values, v)
			}
		}
		assertNoSecret(t, fmt.Sprintf("case %d error", i), message(err), values...)
		if meta, _ := store.readMeta("pvc-1"); meta != nil {
			t.Fatalf("case %d created the volume", i)
		}
	}
	// A 32-character key is long enough.
	if _, err := c.CreateVolume(context.Background(), createRequest("pvc-1", map[string]string{"key": strings.Repeat("k", 32)})); err != nil {
		t.Fatalf("32-character key: %v", err)
	}
}

func TestIdempotentCreateWithAnotherKeyIsRefused(t *testing.T) {
	store, _ := newTestStore(t)
	c := &Controller{profile: profiles["namespaced-block"], nodeID: "n1", store: store}
	ctx := context.Background()
	if _, err := c.CreateVolume(ctx, createRequest("pvc-1", map[string]string{"key": testKey})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVolume(ctx, createRequest("pvc-2", nil)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		secrets map[string]string
		want    string
	}{
		{"pvc-1", map[string]string{"key": otherKey}, "volume pvc-1 exists with incompatible parameters: it is encrypted with a different key"},
		{"pvc-1", nil, "volume pvc-1 exists with incompatible parameters: it is encrypted and this request carries no key"},
		{"pvc-2", map[string]string{"key": testKey}, "volume pvc-2 exists with incompatible parameters: it is not encrypted and this request carries a key"},
	}
	for _, tc := range cases {
		_, err := c.CreateVolume(ctx, createRequest(tc.name, tc.secrets))
		if code(err) != codes.AlreadyExists || message(err) != tc.want {
			t.Errorf("%s %v: want AlreadyExists %q, got %v", tc.name, tc.secrets != nil, tc.want, err)
		}
		assertNoSecret(t, "error", message(err), testKey, otherKey)
	}
	meta, _ := store.readMeta("pvc-1")
	if meta == nil || meta.KeySHA256 != keyDigest(testKey) {
		t.Fatalf("the refused retry changed the volume: %+v", meta)
	}
}

func TestCheckKey(t *testing.T) {
	plain := &VolumeMeta{ID: "pvc-1"}
	locked := &VolumeMeta{ID: "pvc-1", KeySHA256: keyDigest(testKey)}
	cases := []struct {
		meta    *VolumeMeta
		secrets map[string]string
		want    error
	}{
		{nil, nil, nil},
		{plain, nil, nil},
		{plain, map[string]string{"key": "anything", "other": "x"}, nil},
		{locked, nil, errKeyMissing},
		{locked, map[string]string{"other": testKey}, errKeyMissing},
		{locked, map[string]string{"key": ""}, errKeyMissing},
		{locked, map[string]string{"key": otherKey}, errKeyWrong},
		{locked, map[string]string{"key": testKey + " "}, errKeyWrong},
		{locked, map[string]string{"key": testKey}, nil},
	}
	for i, tc := range cases {
		if got := checkKey(tc.meta, tc.secrets); got != tc.want {
			t.Errorf("case %d: got %v, want %v", i, got, tc.want)
		}
	}
	if err := publishKeyError("pvc-1", errKeyMissing); code(err) != codes.PermissionDenied ||
		message(err) != "volume pvc-1 is encrypted and the publish request carries no key (the PersistentVolume needs spec.csi.nodePublishSecretRef)" {
		t.Errorf("publish, no key: %v", err)
	}
	if err := publishKeyError("pvc-1", errKeyWrong); code(err) != codes.PermissionDenied ||
		message(err) != "volume pvc-1 is encrypted and the key given does not unlock it" {
		t.Errorf("publish, wrong key: %v", err)
	}
	if err := deleteKeyError("pvc-1", errKeyMissing); code(err) != codes.FailedPrecondition ||
		message(err) != "volume pvc-1 is encrypted; deleting it needs its key (the provisioner secret must still exist)" {
		t.Errorf("delete, no key: %v", err)
	}
	if err := deleteKeyError("pvc-1", errKeyWrong); code(err) != codes.PermissionDenied ||
		message(err) != "volume pvc-1 is encrypted and the key given does not unlock it" {
		t.Errorf("delete, wrong key: %v", err)
	}
	if publishKeyError("pvc-1", nil) != nil || deleteKeyError("pvc-1", nil) != nil {
		t.Error("no refusal turned into an error")
	}
}

func TestDeleteNeedsTheKey(t *testing.T) {
	store, _ := newTestStore(t)
	c := &Controller{profile: profiles["namespaced-block"], nodeID: "n1", store: store}
	ctx := context.Background()
	if _, err := c.CreateVolume(ctx, createRequest("pvc-1", map[string]string{"key": testKey})); err != nil {
		t.Fatal(err)
	}
	del := func(secrets map[string]string) error {
		_, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-1:team-a", Secrets: secrets})
		return err
	}
	if err := del(nil); code(err) != codes.FailedPrecondition ||
		message(err) != "volume pvc-1 is encrypted; deleting it needs its key (the provisioner secret must still exist)" {
		t.Fatalf("delete without key: %v", err)
	}
	if err := del(map[string]string{"key": otherKey}); code(err) != codes.PermissionDenied ||
		message(err) != "volume pvc-1 is encrypted and the key given does not unlock it" {
		t.Fatalf("delete with the wrong key: %v", err)
	}
	if meta, _ := store.readMeta("pvc-1"); meta == nil {
		t.Fatal("a refused delete removed the volume")
	}
	if _, err := os.Stat(store.volumeDir("pvc-1")); err != nil {
		t.Fatalf("a refused delete removed the volume's directory: %v", err)
	}
	if err := del(map[string]string{"key": testKey}); err != nil {
		t.Fatalf("delete with the key: %v", err)
	}
	if meta, _ := store.readMeta("pvc-1"); meta != nil {
		t.Fatal("volume survived its delete")
	}
	// Deleted already: idempotent success, whatever the secrets.
	if err := del(nil); err != nil {
		t.Fatalf("repeated delete: %v", err)
	}
	// An unencrypted volume is deleted without secrets, as before.
	if _, err := c.CreateVolume(ctx, createRequest("pvc-2", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-2:team-a"}); err != nil {
		t.Fatalf("unencrypted delete: %v", err)
	}
}

func readJournal(t *testing.T, store *Store) []map[string]any {
	t.Helper()
	f, err := os.Open(store.journalPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		var v map[string]any
		if err := json.Unmarshal(scanner.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, v)
	}
	return lines
}

// TestEncryptedPublish publishes through the Node service with real bind mounts (root only, as
// the driver itself runs).
func TestEncryptedPublish(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root; TestCheckKey covers the decision")
	}
	store, _ := newTestStore(t)
	ctx := context.Background()
	block := profiles["namespaced-block"]
	c := &Controller{profile: block, nodeID: "n1", store: store}
	n := &Node{profile: block, nodeID: "n1", store: store}
	if _, err := c.CreateVolume(ctx, createRequest("pvc-1", map[string]string{"key": testKey})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVolume(ctx, createRequest("pvc-2", nil)); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"pvc-1:team-a", "pvc-2:team-a"} {
		if _, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
			VolumeId: h, NodeId: "n1", VolumeCapability: capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(store.volumeDir("pvc-1"), "model.bin"), []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	targets := t.TempDir()
	publish := func(handle, target string, secrets map[string]string) error {
		t.Cleanup(func() {
			for {
				if _, ok, _ := mountAt(target); !ok {
					return
				}
				if err := unix.Unmount(target, 0); err != nil {
					t.Errorf("unmounting %s: %v", target, err)
					return
				}
			}
		})
		_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId:         handle,
			TargetPath:       target,
			VolumeCapability: capability(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
			VolumeContext:    map[string]string{ctxPodNamespace: "team-a", ctxPodName: "p", ctxPodUID: "u"},
			Secrets:          secrets,
		})
		return err
	}
	mounted := func(target string) bool {
		_, ok, err := mountAt(target)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	noKey := filepath.Join(targets, "no-key")
	if err := publish("pvc-1:team-a", noKey, map[string]string{"other": "x"}); code(err) != codes.PermissionDenied ||
		message(err) != "volume pvc-1 is encrypted and the publish request carries no key (the PersistentVolume needs spec.csi.nodePublishSecretRef)" {
		t.Fatalf("publish without key: %v", err)
	}
	if mounted(noKey) {
		t.Fatal("publish without key mounted")
	}
	wrong := filepath.Join(targets, "wrong-key")
	if err := publish("pvc-1:team-a", wrong, map[string]string{"key": otherKey}); code(err) != codes.PermissionDenied ||
		message(err) != "volume pvc-1 is encrypted and the key given does not unlock it" {
		t.Fatalf("publish with the wrong key: %v", err)
	}
	if mounted(wrong) {
		t.Fatal("publish with the wrong key mounted")
	}
	right := filepath.Join(targets, "right-key")
	if err := publish("pvc-1:team-a", right, map[string]string{"key": testKey}); err != nil {
		t.Fatalf("publish with the key: %v", err)
	}
	if !mounted(right) {
		t.Fatal("publish with the key did not mount")
	}
	if data, err := os.ReadFile(filepath.Join(right, "model.bin")); err != nil || string(data) != "weights" {
		t.Fatalf("the unlocked volume: %q %v", data, err)
	}
	// An unencrypted volume ignores secrets, as before.
	plain := filepath.Join(targets, "plain")
	if err := publish("pvc-2:team-a", plain, map[string]string{"key": otherKey, "other": "x"}); err != nil {
		t.Fatalf("unencrypted publish with secrets: %v", err)
	}
	plainNoSecrets := filepath.Join(targets, "plain-no-secrets")
	if err := publish("pvc-2:team-a", plainNoSecrets, nil); err != nil {
		t.Fatalf("unencrypted publish: %v", err)
	}
	if !mounted(plain) || !mounted(plainNoSecrets) {
		t.Fatal("unencrypted publish did not mount")
	}

	// The journal records each call, refusals with their error, and whether the volume is
	// encrypted; never a key.
	journal := readJournal(t, store)
	want := []struct {
		target    string
		encrypted bool
		error     string
	}{
		{noKey, true, "PermissionDenied"},
		{wrong, true, "PermissionDenied"},
		{right, true, ""},
		{plain, false, ""},
		{plainNoSecrets, false, ""},
	}
	if len(journal) != len(want) {
		t.Fatalf("journal %v", journal)
	}
	for i, w := range want {
		line := journal[i]
		if line["targetPath"] != w.target || line["encrypted"] != w.encrypted || line["attachedReadOnly"] != false {
			t.Errorf("journal line %d: %v", i, line)
		}
		errText, _ := line["error"].(string)
		if (w.error == "") != (errText == "") || !strings.Contains(errText, w.error) {
			t.Errorf("journal line %d error %q, want %q", i, errText, w.error)
		}
	}
	raw, err := os.ReadFile(store.journalPath())
	if err != nil {
		t.Fatal(err)
	}
	assertNoSecret(t, "journal", string(raw), testKey, otherKey)

	if _, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "pvc-1:team-a", TargetPath: right}); err != nil {
		t.Fatal(err)
	}
	if mounted(right) {
		t.Fatal("unpublish left the mount")
	}
}

func TestLoggedCallsCarryNoSecret(t *testing.T) {
	var out bytes.Buffer
	log.SetOutput(&out)
	defer log.SetOutput(os.Stderr)
	interceptor := logCalls("test")
	req := createRequest("pvc-1", map[string]string{"key": testKey})
	for _, fail := range []bool{false, true} {
		_, _ = interceptor(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/CreateVolume"},
			func(context.Context, any) (any, error) {
				if fail {
					return nil, status.Error(codes.Internal, "boom")
				}
				return &csi.CreateVolumeResponse{}, nil
			})
	}
	if !strings.Contains(out.String(), "(redacted)") || strings.Count(out.String(), "CreateVolume") != 2 {
		t.Fatalf("log: %s", out.String())
	}
	assertNoSecret(t, "log", out.String(), testKey)
}

func TestLogRedactsSecrets(t *testing.T) {
	req := createRequest("pvc-1", map[string]string{"key": testKey, "other": "other-secret-value"})
	text := fmt.Sprint(redactSecrets(req))
	assertNoSecret(t, "logged request", text, testKey, "other-secret-value")
	for _, want := range []string{"pvc-1", `"key"`, `"other"`, "(redacted)", "team-a"} {
		if !strings.Contains(text, want) {
			t.Errorf("logged request lacks %s: %s", want, text)
		}
	}
	if req.GetSecrets()["key"] != testKey {
		t.Fatal("redaction changed the request")
	}
	for _, r := range []any{
		&csi.DeleteVolumeRequest{VolumeId: "pvc-1:team-a", Secrets: map[string]string{"key": testKey}},
		&csi.NodePublishVolumeRequest{VolumeId: "pvc-1:team-a", Secrets: map[string]string{"key": testKey}},
	} {
		assertNoSecret(t, "logged request", fmt.Sprint(redactSecrets(r)), testKey)
	}
	// Messages without secrets are logged as they are.
	probe := &csi.ProbeRequest{}
	if redactSecrets(probe) != any(probe) {
		t.Error("a message without secrets was copied")
	}
	plain := createRequest("pvc-1", nil)
	if redactSecrets(plain) != any(plain) {
		t.Error("a request with no secrets was copied")
	}
}
