package snapshot

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Dedup scopes.
//
// A content-addressed store that dedups across tenants is an oracle: a
// Put's BytesNew (and its speed) tells whether someone else already stored
// the same bytes, so a tenant could confirm a guess at another tenant's
// file (a 6-digit PIN in a known config file falls to a million guesses).
// So a chunk's address depends on a scope as well as its content: in the
// shared scope it is the SHA-256 of the bytes (the format of version-1
// manifests, which all read as shared), in any other scope it is
// HMAC-SHA256(scope key, bytes) with scope key = HMAC-SHA256(master key,
// scope). Identical data in two scopes has unrelated addresses, so a Put
// dedups only against chunks of its own scope, and nobody who lacks the
// master key can compute another scope's addresses.
//
// The master key is 32 random bytes in <root>/KEY (0600), made the first
// time the store is opened. Lose it and every scoped chunk fails
// verification (ErrCorrupt): it belongs in the same backup as the chunks.

// SharedScope is the scope whose chunks every snapshot may dedup against:
// data that is not any one tenant's, such as a template's filesystem.
const SharedScope = ""

const (
	keyName     = "KEY"
	keySize     = 32
	maxScopeLen = 256
)

// validScope reports whether scope can name a dedup scope.
func validScope(scope string) error {
	if len(scope) > maxScopeLen || !utf8.ValidString(scope) {
		return errdefs.InvalidArgument("invalid dedup scope (at most %d bytes of UTF-8)", maxScopeLen)
	}
	for _, r := range scope {
		if r < 0x20 || r == 0x7f {
			return errdefs.InvalidArgument("invalid dedup scope: control character")
		}
	}
	return nil
}

// loadKey reads the store's master key, creating it on first use. The key
// is written to a temp file and hard-linked into place, so a crash never
// leaves a short key and two creators agree on one.
func loadKey(root string) ([]byte, error) {
	p := filepath.Join(root, keyName)
	key, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		if err := createKey(root, p); err != nil {
			return nil, err
		}
		key, err = os.ReadFile(p)
	}
	if err != nil {
		return nil, err
	}
	if len(key) != keySize {
		return nil, fmt.Errorf("%s holds %d bytes, want %d", p, len(key), keySize)
	}
	return key, nil
}

func createKey(root, p string) error {
	fresh := make([]byte, keySize)
	if _, err := rand.Read(fresh); err != nil {
		return err
	}
	tmp, err := writeTemp(root, keyName, fresh) // 0600
	if err != nil {
		return err
	}
	err = os.Link(tmp, p)
	os.Remove(tmp)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return syncDir(root)
}

// scopeKeys derives and caches the per-scope keys.
type scopeKeys struct {
	master []byte
	mu     sync.Mutex
	keys   map[string][]byte
}

// key returns the key of scope; nil for SharedScope.
func (k *scopeKeys) key(scope string) []byte {
	if scope == SharedScope {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if sk, ok := k.keys[scope]; ok {
		return sk
	}
	m := hmac.New(sha256.New, k.master)
	m.Write([]byte("space snapshot dedup scope\x00"))
	m.Write([]byte(scope))
	sk := m.Sum(nil)
	if k.keys == nil {
		k.keys = map[string][]byte{}
	}
	k.keys[scope] = sk
	return sk
}

// addresser computes chunk addresses in one scope. It is not safe for
// concurrent use: make one per goroutine.
type addresser struct {
	h hash.Hash
}

// newAddresser returns an addresser for the scope whose key is key (nil:
// the shared scope, plain SHA-256).
func newAddresser(key []byte) *addresser {
	if key == nil {
		return &addresser{h: sha256.New()}
	}
	return &addresser{h: hmac.New(sha256.New, key)}
}

// of returns the hex address of data.
func (a *addresser) of(data []byte) string {
	a.h.Reset()
	a.h.Write(data)
	var sum [sha256.Size]byte
	return hex.EncodeToString(a.h.Sum(sum[:0]))
}

// address returns the address of data in scope.
func (s *Store) address(scope string, data []byte) string {
	return newAddresser(s.scopes.key(scope)).of(data)
}
