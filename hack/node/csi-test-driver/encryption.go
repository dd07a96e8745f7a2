package main

// Encryption at rest with per-volume keys (profiles with Encryption). A simulation of how a CSI
// driver with per-volume keys behaves toward Kubernetes, not of any storage system's own
// mechanism: the volume's bytes stay plain files on the test machine. What it reproduces is the
// contract: a volume created with a key (the provisioner secret the StorageClass names) records
// the key's SHA-256 (never the key), every NodePublishVolume must carry the same key (the PV's
// spec.csi.nodePublishSecretRef) or nothing is mounted, and DeleteVolume needs it too (the
// external-provisioner passes the provisioner secret the PV's annotations name). No secret value
// is ever logged, journaled or put in an error message.

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// secretKeyEntry is the only secret entry an encryption profile takes: the volume's key.
	secretKeyEntry = "key"
	// minKeyLength is the shortest key accepted, in characters.
	minKeyLength = 32
)

var (
	errKeyMissing = errors.New("the request carries no key")
	errKeyWrong   = errors.New("the key given does not unlock the volume")
)

// keyDigest is what the state records of a volume's key: its hex SHA-256.
func keyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// createKeyDigest validates CreateVolume's secrets and returns the digest to record: empty for
// an unencrypted volume (no "key" entry, or a profile without encryption, which ignores secrets).
// Unknown entries and short keys are refused with InvalidArgument naming entries, never values.
func (p Profile) createKeyDigest(secrets map[string]string) (string, error) {
	if !p.Encryption {
		return "", nil
	}
	var unknown []string
	for name := range secrets {
		if name != secretKeyEntry {
			unknown = append(unknown, fmt.Sprintf("%q", name))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return "", status.Errorf(codes.InvalidArgument,
			"provisioner secret entries %s are not known to this test driver (profile %s takes only the entry %q, the volume's key)",
			strings.Join(unknown, ", "), p.Name, secretKeyEntry)
	}
	key, ok := secrets[secretKeyEntry]
	if !ok {
		return "", nil
	}
	if utf8.RuneCountInString(key) < minKeyLength {
		return "", status.Errorf(codes.InvalidArgument,
			"provisioner secret entry %q is shorter than %d characters (profile %s needs a volume key of at least %d characters)",
			secretKeyEntry, minKeyLength, p.Name, minKeyLength)
	}
	return keyDigest(key), nil
}

// checkKey decides whether secrets unlock the volume: nil for an unencrypted volume (whatever the
// secrets) or the right key, errKeyMissing when the secrets have no (or an empty) "key" entry,
// errKeyWrong when its digest differs from the recorded one.
func checkKey(meta *VolumeMeta, secrets map[string]string) error {
	if meta == nil || meta.KeySHA256 == "" {
		return nil
	}
	key := secrets[secretKeyEntry]
	if key == "" {
		return errKeyMissing
	}
	if subtle.ConstantTimeCompare([]byte(keyDigest(key)), []byte(meta.KeySHA256)) != 1 {
		return errKeyWrong
	}
	return nil
}

// publishKeyError is checkKey's refusal of a NodePublishVolume (or NodeStageVolume) as a gRPC
// status: PermissionDenied either way.
func publishKeyError(id string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errKeyMissing):
		return status.Errorf(codes.PermissionDenied,
			"volume %s is encrypted and the publish request carries no key (the PersistentVolume needs spec.csi.nodePublishSecretRef)", id)
	default:
		return status.Errorf(codes.PermissionDenied, "volume %s is encrypted and the key given does not unlock it", id)
	}
}

// deleteKeyError is checkKey's refusal of a DeleteVolume as a gRPC status: FailedPrecondition
// without a key (the provisioner secret is gone: the volume cannot be deleted until it is back),
// PermissionDenied with a wrong one.
func deleteKeyError(id string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errKeyMissing):
		return status.Errorf(codes.FailedPrecondition,
			"volume %s is encrypted; deleting it needs its key (the provisioner secret must still exist)", id)
	default:
		return status.Errorf(codes.PermissionDenied, "volume %s is encrypted and the key given does not unlock it", id)
	}
}

// encryptionMismatch describes, for an AlreadyExists refusal of a repeated CreateVolume, how the
// existing volume's encryption differs from the request's (digests are compared, never shown).
func encryptionMismatch(existing, requested string) string {
	switch {
	case existing == "":
		return "it is not encrypted and this request carries a key"
	case requested == "":
		return "it is encrypted and this request carries no key"
	default:
		return "it is encrypted with a different key"
	}
}
