package egress

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Secret is a credential kept on the host. Only its placeholder enters a
// sandbox; the proxy swaps it for Value on requests to Hosts.
//
// Secret redacts Value when logged (slog.LogValuer), printed (fmt) or
// marshalled to JSON.
type Secret struct {
	Name  string `json:"name"`
	Value []byte `json:"-"`
	// Hosts are exact names or "*.domain", each with an optional ":port";
	// the value is injected only on the ports named, 443 for an entry
	// without one.
	Hosts  []string  `json:"hosts"`
	Inject Injection `json:"inject"`
}

// Injection says where the value goes. Exactly one of Header, BasicAuth and
// QueryParam is set.
//
//   - Header: in that header, a value equal to the placeholder becomes
//     Format with "{value}" replaced (default "{value}"); otherwise each
//     occurrence of the placeholder is replaced by the value
//     ("Authorization: Bearer <placeholder>" works with either).
//   - BasicAuth: "Authorization: Basic base64(user:<placeholder>)" (as git
//     and curl send for https://user:$TOKEN@host) gets the value as password;
//     User, when set, replaces the user name.
//   - QueryParam: the placeholder inside that query parameter's value.
type Injection struct {
	Header     string     `json:"header,omitempty"`
	Format     string     `json:"format,omitempty"`
	BasicAuth  *BasicAuth `json:"basic_auth,omitempty"`
	QueryParam string     `json:"query_param,omitempty"`
}

// BasicAuth injects the value as an HTTP basic-auth password.
type BasicAuth struct {
	User string `json:"user,omitempty"`
}

// LogValue implements slog.LogValuer: name and hosts only.
func (s Secret) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", s.Name), slog.String("hosts", strings.Join(s.Hosts, ",")))
}

// String and GoString keep the value out of fmt output.
func (s Secret) String() string   { return "secret " + s.Name + " (value redacted)" }
func (s Secret) GoString() string { return s.String() }

var secretName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// MinSecretLen is the shortest value a new secret may have. A shorter one
// falls to guessing and cannot be told apart from ordinary text in the
// responses it is scrubbed from.
const MinSecretLen = 8

// Validate checks a new secret: the name (an environment variable name),
// value (MinSecretLen to 64 KiB), hosts and injection
// (errdefs.ErrInvalidArgument; the message never holds the value).
func (s Secret) Validate() error {
	if len(s.Value) < MinSecretLen && len(s.Value) > 0 {
		return errdefs.InvalidArgument("secret %s: value must be at least %d bytes (a shorter one can be guessed, and cannot be scrubbed from responses reliably)", s.Name, MinSecretLen)
	}
	return s.validate()
}

// validate is Validate without the minimum length, for secrets stored
// before it was required: they are still bound, and scrubbed wherever
// their value occurs (see newScrubber).
func (s Secret) validate() error {
	if !secretName.MatchString(s.Name) {
		return errdefs.InvalidArgument("secret name %q: want an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most 128)", s.Name)
	}
	if len(s.Value) == 0 || len(s.Value) > 64<<10 {
		return errdefs.InvalidArgument("secret %s: value must be %d bytes to 64 KiB", s.Name, MinSecretLen) // (stored ones: 1 byte or more)
	}
	if strings.ContainsAny(string(s.Value), "\r\n\x00") {
		return errdefs.InvalidArgument("secret %s: value may not contain CR, LF or NUL", s.Name)
	}
	if _, err := hostPatterns(s.Hosts); err != nil {
		return fmt.Errorf("secret %s: %w", s.Name, err)
	}
	n := 0
	if s.Inject.Header != "" {
		n++
		if !validToken(s.Inject.Header) {
			return errdefs.InvalidArgument("secret %s: header %q is not a valid header name", s.Name, s.Inject.Header)
		}
		if s.Inject.Format != "" && !strings.Contains(s.Inject.Format, "{value}") {
			return errdefs.InvalidArgument("secret %s: format must contain {value}", s.Name)
		}
	}
	if s.Inject.BasicAuth != nil {
		n++
		if strings.Contains(s.Inject.BasicAuth.User, ":") {
			return errdefs.InvalidArgument("secret %s: basic-auth user may not contain ':'", s.Name)
		}
	}
	if s.Inject.QueryParam != "" {
		n++
	}
	if n != 1 {
		return errdefs.InvalidArgument("secret %s: set exactly one of header, basic_auth, query_param", s.Name)
	}
	return nil
}

func validToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

// PlaceholderPrefix starts every placeholder.
const PlaceholderPrefix = "space_ph_"

var placeholderRE = regexp.MustCompile(`^space_ph_[0-9a-f]{32}$`)

// NewPlaceholder mints an opaque random placeholder ("space_ph_" and 32 hex
// digits). Mint one per secret per sandbox, and again for each fork child.
func NewPlaceholder() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return PlaceholderPrefix + hex.EncodeToString(b[:])
}

// sealer encrypts small records with AES-256-GCM under a 32-byte key file.
type sealer struct{ aead cipher.AEAD }

func openSealer(dir, keyFile string) (*sealer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress: key dir: %w", err)
	}
	path := filepath.Join(dir, keyFile)
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
		f, cerr := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		switch {
		case errors.Is(cerr, fs.ErrExist): // another process won the race
			key, err = os.ReadFile(path)
		case cerr != nil:
			return nil, fmt.Errorf("egress: create key: %w", cerr)
		default:
			_, werr := f.Write(key)
			if serr := f.Sync(); werr == nil {
				werr = serr
			}
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				return nil, fmt.Errorf("egress: write key: %w", werr)
			}
			err = nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("egress: read key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("egress: key file %s: want 32 bytes, have %d: %w", path, len(key), errdefs.ErrInternal)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

func (s *sealer) seal(plain, aad []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	_, _ = rand.Read(nonce)
	return s.aead.Seal(nonce, nonce, plain, aad)
}

func (s *sealer) open(data, aad []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(data) < n {
		return nil, fmt.Errorf("egress: sealed record too short: %w", errdefs.ErrInternal)
	}
	out, err := s.aead.Open(nil, data[:n], data[n:], aad)
	if err != nil {
		return nil, fmt.Errorf("egress: sealed record does not authenticate: %w", errdefs.ErrInternal)
	}
	return out, nil
}

// writeFileAtomic writes via a temporary file and rename, mode 0600.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// SecretStore keeps secrets in dir, one "<name>.json" file each, with the
// value sealed by AES-256-GCM under dir/secrets.key (0600, generated on
// first use). The name is authenticated with the value, so sealed values
// cannot be swapped between files. Safe for concurrent use in one process.
type SecretStore struct {
	dir  string
	seal *sealer
	mu   sync.Mutex
}

type secretFile struct {
	Name   string    `json:"name"`
	Hosts  []string  `json:"hosts"`
	Inject Injection `json:"inject"`
	Sealed []byte    `json:"sealed_value"`
}

// NewSecretStore opens (creating) a store in dir.
func NewSecretStore(dir string) (*SecretStore, error) {
	s, err := openSealer(dir, "secrets.key")
	if err != nil {
		return nil, err
	}
	return &SecretStore{dir: dir, seal: s}, nil
}

func (st *SecretStore) path(name string) string { return filepath.Join(st.dir, name+".json") }

// Put creates or replaces a secret (errdefs.ErrInvalidArgument if invalid).
func (st *SecretStore) Put(s Secret) error {
	if err := s.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(secretFile{Name: s.Name, Hosts: s.Hosts, Inject: s.Inject, Sealed: st.seal.seal(s.Value, []byte(s.Name))})
	if err != nil {
		return err
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := writeFileAtomic(st.path(s.Name), b); err != nil {
		return fmt.Errorf("egress: store secret %s: %w", s.Name, err)
	}
	return nil
}

// Get returns the secret with its value (errdefs.ErrNotFound).
func (st *SecretStore) Get(name string) (Secret, error) {
	s, sealed, err := st.read(name)
	if err != nil {
		return Secret{}, err
	}
	v, err := st.seal.open(sealed, []byte(name))
	if err != nil {
		return Secret{}, fmt.Errorf("secret %s: %w", name, err)
	}
	s.Value = v
	return s, nil
}

func (st *SecretStore) read(name string) (Secret, []byte, error) {
	if !secretName.MatchString(name) {
		return Secret{}, nil, errdefs.NotFound("secret %q not found", name)
	}
	b, err := os.ReadFile(st.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Secret{}, nil, errdefs.NotFound("secret %q not found", name)
	}
	if err != nil {
		return Secret{}, nil, err
	}
	var f secretFile
	if err := json.Unmarshal(b, &f); err != nil || f.Name != name {
		return Secret{}, nil, fmt.Errorf("secret %s: corrupt record: %w", name, errdefs.ErrInternal)
	}
	return Secret{Name: f.Name, Hosts: f.Hosts, Inject: f.Inject}, f.Sealed, nil
}

// List returns every secret without values, sorted by name.
func (st *SecretStore) List() ([]Secret, error) {
	ents, err := os.ReadDir(st.dir)
	if err != nil {
		return nil, err
	}
	var out []Secret
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !secretName.MatchString(name) {
			continue
		}
		s, _, err := st.read(name)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			return nil, err
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Secret) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Delete removes a secret (errdefs.ErrNotFound).
func (st *SecretStore) Delete(name string) error {
	if !secretName.MatchString(name) {
		return errdefs.NotFound("secret %q not found", name)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	err := os.Remove(st.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.NotFound("secret %q not found", name)
	}
	return err
}
