package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestHandles(t *testing.T) {
	block, shared := profiles["namespaced-block"], profiles["shared-fs"]
	if got := block.handleFor("pvc-1", "team-a"); got != "pvc-1:team-a" {
		t.Fatalf("block handle %q", got)
	}
	if got := shared.handleFor("pvc-1", "team-a"); got != "pvc-1" {
		t.Fatalf("shared handle %q", got)
	}
	h, err := block.parseHandle("pvc-1:team-b")
	if err != nil || h.ID != "pvc-1" || h.Namespace != "team-b" {
		t.Fatalf("parse: %+v %v", h, err)
	}
	for _, bad := range []string{"pvc-1", "pvc-1:", ":ns", "../x:ns", "pvc-1:Team"} {
		if _, err := block.parseHandle(bad); err == nil {
			t.Errorf("block accepted %q", bad)
		}
	}
	for _, bad := range []string{"pvc-1:team-a", "../etc", "", "A"} {
		if _, err := shared.parseHandle(bad); err == nil {
			t.Errorf("shared accepted %q", bad)
		}
	}
}

func capability(mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func TestCapabilities(t *testing.T) {
	block, shared := profiles["namespaced-block"], profiles["shared-fs"]
	rwx := csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	rwo := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	rox := csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	cases := []struct {
		p    Profile
		c    *csi.VolumeCapability
		ok   bool
		want string
	}{
		{shared, capability(rwx), true, ""},
		{shared, capability(rox, "ro"), true, ""},
		{shared, capability(rwo), false, "not supported by profile shared-fs"},
		{shared, capability(rox, "nouuid"), false, `mount option "nouuid"`},
		{block, capability(rwo), true, ""},
		{block, capability(rox, "ro", "norecovery", "nouuid"), true, ""},
		{block, capability(rox, "norecovery"), false, "norecovery needs ro"},
		{block, capability(rwx), false, "not supported by profile namespaced-block"},
		{block, &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: &csi.VolumeCapability_AccessMode{Mode: rwo}}, false, "raw block"},
		{block, nil, false, "missing"},
	}
	for i, c := range cases {
		err := c.p.checkCapability(c.c)
		if c.ok && err != nil {
			t.Errorf("case %d: refused: %v", i, err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("case %d: want error containing %q, got %v", i, c.want, err)
		}
	}
	if ro, err := block.readOnlyFromFlags([]string{"ro", "nouuid"}); err != nil || !ro {
		t.Errorf("ro flag not read: %v %v", ro, err)
	}
	if ro, err := block.readOnlyFromFlags(nil); err != nil || ro {
		t.Errorf("no flags read as ro: %v %v", ro, err)
	}
}

func code(err error) codes.Code {
	var s interface{ GRPCStatus() *status.Status }
	if errors.As(err, &s) {
		return s.GRPCStatus().Code()
	}
	return codes.Unknown
}

func TestOneReadWriteAttachmentAtATime(t *testing.T) {
	writer := Attachment{Handle: "pvc-1:ns-a", ID: "pvc-1", NodeID: "n1", ReadOnly: false}
	reader := Attachment{Handle: "pvc-1:ns-b", ID: "pvc-1", NodeID: "n1", ReadOnly: true}
	reader2 := Attachment{Handle: "pvc-1:ns-c", ID: "pvc-1", NodeID: "n1", ReadOnly: true}
	other := Attachment{Handle: "pvc-2:ns-a", ID: "pvc-2", NodeID: "n1", ReadOnly: false}

	// A read-only attach while the volume is attached read-write (through another handle) fails.
	if _, err := decideAttach([]Attachment{writer}, reader); code(err) != codes.FailedPrecondition {
		t.Fatalf("read-only attach beside a read-write one: %v", err)
	}
	// Once the writer is detached it succeeds, and readers share.
	if dup, err := decideAttach(nil, reader); err != nil || dup {
		t.Fatalf("read-only attach alone: %v %v", dup, err)
	}
	if _, err := decideAttach([]Attachment{reader}, reader2); err != nil {
		t.Fatalf("second reader: %v", err)
	}
	// A read-write attach beside readers or another writer fails.
	if _, err := decideAttach([]Attachment{reader}, writer); code(err) != codes.FailedPrecondition {
		t.Fatalf("read-write attach beside a reader: %v", err)
	}
	w2 := writer
	w2.Handle = "pvc-1:ns-z"
	if _, err := decideAttach([]Attachment{writer}, w2); code(err) != codes.FailedPrecondition {
		t.Fatalf("two writers: %v", err)
	}
	// Other volumes do not interfere; a retry is idempotent; a flag flip is AlreadyExists.
	if _, err := decideAttach([]Attachment{other}, reader); err != nil {
		t.Fatalf("other volume interfered: %v", err)
	}
	if dup, err := decideAttach([]Attachment{writer}, writer); err != nil || !dup {
		t.Fatalf("retry: %v %v", dup, err)
	}
	flipped := writer
	flipped.ReadOnly = true
	if _, err := decideAttach([]Attachment{writer}, flipped); code(err) != codes.AlreadyExists {
		t.Fatalf("flag flip: %v", err)
	}
}

func TestUnescapeMountPath(t *testing.T) {
	if got := unescapeMountPath(`/a\040b/c\011d`); got != "/a b/c\td" {
		t.Fatalf("%q", got)
	}
	if got := unescapeMountPath(`/plain`); got != "/plain" {
		t.Fatalf("%q", got)
	}
}

func TestTenantExports(t *testing.T) {
	tenant, shared, block := profiles["tenant-fs"], profiles["shared-fs"], profiles["namespaced-block"]
	// Profiles without tenants export the volume's directory to every namespace.
	for _, p := range []Profile{shared, block} {
		if got, err := p.exportDir("/s/volumes/pvc-1", "team-b"); err != nil || got != "/s/volumes/pvc-1" {
			t.Fatalf("%s: %q %v", p.Name, got, err)
		}
	}
	// The tenant profile gives each namespace its own directory: a reader in another namespace
	// publishing the writer's very handle never sees the writer's export.
	a, err := tenant.exportDir("/s/volumes/pvc-1", "team-a")
	if err != nil || a != "/s/volumes/pvc-1/tenants/team-a" {
		t.Fatalf("writer export %q %v", a, err)
	}
	b, err := tenant.exportDir("/s/volumes/pvc-1", "team-b")
	if err != nil || b == a {
		t.Fatalf("reader export %q %v", b, err)
	}
	for _, bad := range []string{"", "../x", "Team"} {
		if _, err := tenant.exportDir("/s/volumes/pvc-1", bad); err == nil {
			t.Errorf("tenant profile accepted namespace %q", bad)
		}
	}
	// Otherwise it is a shared file system: RWX and ROX, handles without namespace, no attach.
	if tenant.NamespacedHandle || tenant.Attach {
		t.Fatalf("tenant-fs: %+v", tenant)
	}
	if err := tenant.checkCapability(capability(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)); err != nil {
		t.Fatal(err)
	}
	if err := tenant.checkCapability(capability(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, "ro")); err != nil {
		t.Fatal(err)
	}
	names := profileNames()
	if len(names) != len(profiles) {
		t.Fatalf("profileNames %v does not list every profile", names)
	}
	for _, n := range names {
		if _, ok := profiles[n]; !ok {
			t.Fatalf("profileNames lists unknown %q", n)
		}
	}
}

func TestTenantPublishSeesOnlyItsOwnNamespace(t *testing.T) {
	dir := t.TempDir()
	store, err := newStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	tenant := profiles["tenant-fs"]
	vol := store.volumeDir("pvc-1")
	a, _ := tenant.exportDir(vol, "team-a")
	if err := store.ensureExport(a); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "payload.bin"), []byte("model"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second publish in team-a keeps the data.
	if err := store.ensureExport(a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a, "payload.bin")); err != nil {
		t.Fatalf("a second publish lost the tenant's data: %v", err)
	}
	b, _ := tenant.exportDir(vol, "team-b")
	if err := store.ensureExport(b); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(b)
	if err != nil || len(entries) != 0 {
		t.Fatalf("team-b's export is not empty: %v %v", entries, err)
	}
}
