package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Store is the driver's backing storage: one directory per volume under <state>/volumes (the
// export root a pod sees), its metadata under <state>/meta, and the attachments in one JSON
// file, so a restarted driver keeps them. A publish journal (<state>/node-publish.jsonl) records
// every NodePublishVolume call as the driver received it, for tests to assert on.
type Store struct {
	dir string
	mu  sync.Mutex
}

// VolumeMeta is what CreateVolume recorded.
type VolumeMeta struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	Handle        string    `json:"handle"`
	CapacityBytes int64     `json:"capacityBytes"`
	Modes         []string  `json:"modes"`
	Created       time.Time `json:"created"`
	// KeySHA256 is the hex SHA-256 of the volume's key for an encrypted volume (never the key
	// itself), empty for an unencrypted one.
	KeySHA256 string `json:"keySha256,omitempty"`
}

// Attachment is one ControllerPublishVolume that has not been unpublished.
type Attachment struct {
	Handle   string `json:"handle"`
	ID       string `json:"id"`
	NodeID   string `json:"nodeId"`
	ReadOnly bool   `json:"readOnly"`
}

// PublishRecord is one line of the publish journal.
type PublishRecord struct {
	Time         time.Time `json:"time"`
	VolumeHandle string    `json:"volumeHandle"`
	TargetPath   string    `json:"targetPath"`
	Readonly     bool      `json:"readonly"`
	MountFlags   []string  `json:"mountFlags"`
	MountedRO    bool      `json:"mountedReadOnly"`
	PodNamespace string    `json:"podNamespace"`
	PodName      string    `json:"podName"`
	PodUID       string    `json:"podUid"`
	Error        string    `json:"error,omitempty"`
	AttachedRO   *bool     `json:"attachedReadOnly,omitempty"`
	// Encrypted: the volume exists and is encrypted (false when the publish failed before the
	// volume was found).
	Encrypted bool `json:"encrypted"`
}

func newStore(dir string) (*Store, error) {
	for _, sub := range []string{"volumes", "meta"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("creating state directory: %w", err)
		}
	}
	// The volumes directory itself must be traversable by non-root pods; each volume's own
	// mode decides who may write.
	if err := os.Chmod(filepath.Join(dir, "volumes"), 0o711); err != nil {
		return nil, fmt.Errorf("setting the mode of the volumes directory: %w", err)
	}
	return &Store{dir: dir}, nil
}

func (s *Store) volumeDir(id string) string { return filepath.Join(s.dir, "volumes", id) }
func (s *Store) metaPath(id string) string  { return filepath.Join(s.dir, "meta", id+".json") }
func (s *Store) attachmentsPath() string    { return filepath.Join(s.dir, "attachments.json") }
func (s *Store) journalPath() string        { return filepath.Join(s.dir, "node-publish.jsonl") }

// readMeta returns the volume's metadata, or (nil, nil) if the volume does not exist.
func (s *Store) readMeta(id string) (*VolumeMeta, error) {
	data, err := os.ReadFile(s.metaPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading volume metadata: %w", err)
	}
	var m VolumeMeta
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("parsing volume metadata %s: %w", s.metaPath(id), err)
	}
	return &m, nil
}

// createVolume makes the export root (owned by root, mode 0755: a fresh export, as the
// simulated file systems create one) and then records the metadata; the metadata file is
// written last, so a volume whose metadata exists is complete.
func (s *Store) createVolume(m VolumeMeta) error {
	dir := s.volumeDir(m.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating volume directory: %w", err)
	}
	if err := os.Chown(dir, 0, 0); err != nil {
		return fmt.Errorf("chown of volume directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("chmod of volume directory: %w", err)
	}
	return writeJSON(s.metaPath(m.ID), m)
}

// ensureExport creates a tenant's export directory of a volume (root-owned, mode 0755, like a
// fresh volume) unless it exists.
func (s *Store) ensureExport(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating export directory: %w", err)
	}
	if err := os.Chown(dir, 0, 0); err != nil {
		return fmt.Errorf("chown of export directory: %w", err)
	}
	return nil
}

func (s *Store) deleteVolume(id string) error {
	if err := os.Remove(s.metaPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing volume metadata: %w", err)
	}
	if err := os.RemoveAll(s.volumeDir(id)); err != nil {
		return fmt.Errorf("removing volume directory: %w", err)
	}
	return nil
}

func (s *Store) readAttachments() ([]Attachment, error) {
	data, err := os.ReadFile(s.attachmentsPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading attachments: %w", err)
	}
	var list []Attachment
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", s.attachmentsPath(), err)
	}
	return list, nil
}

func (s *Store) writeAttachments(list []Attachment) error {
	if list == nil {
		list = []Attachment{}
	}
	return writeJSON(s.attachmentsPath(), list)
}

func (s *Store) journal(r PublishRecord) error {
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding a publish record: %w", err)
	}
	f, err := os.OpenFile(s.journalPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("opening the publish journal: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing the publish journal: %w", err)
	}
	return f.Close()
}

// writeJSON replaces path atomically (write to a temporary file, then rename).
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming %s: %w", tmp, err)
	}
	return nil
}
