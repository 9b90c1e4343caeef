package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

func TestSecretStore(t *testing.T) {
	dir := t.TempDir()
	st, err := NewSecretStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte("ghp_THIS-IS-THE-REAL-VALUE-0123456789")
	s := Secret{Name: "GITHUB_TOKEN", Value: value, Hosts: []string{"api.github.com"}, Inject: Injection{Header: "Authorization", Format: "Bearer {value}"}}
	if err := st.Put(s); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(Secret{Name: "B", Value: []byte("b-value-123"), Hosts: []string{"*.example.com"}, Inject: Injection{BasicAuth: &BasicAuth{User: "u"}}}); err != nil {
		t.Fatal(err)
	}
	// Nothing on disk holds the value.
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, value) || bytes.Contains(b, []byte("b-value")) {
			t.Errorf("%s holds a secret value in clear", p)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s mode %v", p, fi.Mode())
		}
		return nil
	})
	// Reopen: values survive.
	st2, err := NewSecretStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := st2.Get("GITHUB_TOKEN")
	if err != nil || !bytes.Equal(got.Value, value) || got.Inject.Format != "Bearer {value}" || got.Hosts[0] != "api.github.com" {
		t.Fatalf("Get after reopen: %v %v", got, err)
	}
	list, err := st2.List()
	if err != nil || len(list) != 2 || list[0].Name != "B" || list[1].Name != "GITHUB_TOKEN" {
		t.Fatalf("List: %v %v", list, err)
	}
	for _, l := range list {
		if l.Value != nil {
			t.Errorf("List returned a value for %s", l.Name)
		}
	}
	// A sealed value moved to another name does not open.
	a, _ := os.ReadFile(filepath.Join(dir, "GITHUB_TOKEN.json"))
	os.WriteFile(filepath.Join(dir, "B.json"), bytes.Replace(a, []byte(`"name":"GITHUB_TOKEN"`), []byte(`"name":"B"`), 1), 0o600)
	if _, err := st2.Get("B"); err == nil {
		t.Error("swapped ciphertext opened")
	}
	if err := st2.Delete("GITHUB_TOKEN"); err != nil {
		t.Fatal(err)
	}
	if _, err := st2.Get("GITHUB_TOKEN"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get deleted: %v", err)
	}
	if err := st2.Delete("GITHUB_TOKEN"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Delete twice: %v", err)
	}
	if _, err := st2.Get("../etc/passwd"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("path name: %v", err)
	}
	// A different key cannot read the store.
	os.WriteFile(filepath.Join(dir, "secrets.key"), bytes.Repeat([]byte{1}, 32), 0o600)
	st.Put(Secret{Name: "C", Value: []byte("c-value-123"), Hosts: []string{"a.test"}, Inject: Injection{QueryParam: "k"}})
	st3, _ := NewSecretStore(dir)
	if _, err := st3.Get("C"); err == nil {
		t.Error("opened with the wrong key")
	}
}

func TestSecretValidate(t *testing.T) {
	ok := Secret{Name: "T", Value: []byte("v-123456"), Hosts: []string{"a.test", "b.test:8443", "*.c.test:443"}, Inject: Injection{Header: "X-T"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	// Shorter than MinSecretLen: refused for a new secret, still bound
	// when stored before the minimum (BindSecrets).
	short := ok
	short.Value = []byte("1234567")
	if err := short.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "at least 8 bytes") {
		t.Errorf("a 7-byte value: %v", err)
	}
	if err := short.validate(); err != nil {
		t.Errorf("a stored 7-byte value no longer binds: %v", err)
	}
	bad := []func(*Secret){
		func(s *Secret) { s.Name = "1BAD" },
		func(s *Secret) { s.Name = "a/b" },
		func(s *Secret) { s.Value = nil },
		func(s *Secret) { s.Value = []byte("a\r\nX-Evil: 1") },
		func(s *Secret) { s.Hosts = nil },
		func(s *Secret) { s.Hosts = []string{"10.0.0.0/8"} },
		func(s *Secret) { s.Hosts = []string{"a.test:0"} },
		func(s *Secret) { s.Hosts = []string{"a.test:99999"} },
		func(s *Secret) { s.Hosts = []string{"a.test:x"} },
		func(s *Secret) { s.Hosts = []string{"a.*.test"} },
		// Wildcards over public suffixes: any registrant would get the secret.
		func(s *Secret) { s.Hosts = []string{"*.com"} },
		func(s *Secret) { s.Hosts = []string{"*.co.uk"} },
		func(s *Secret) { s.Hosts = []string{"api.example.com", "*.github.io"} },
		func(s *Secret) { s.Inject = Injection{} },
		func(s *Secret) { s.Inject.QueryParam = "k" },
		func(s *Secret) { s.Inject.Header = "Bad Header" },
		func(s *Secret) { s.Inject.Format = "Bearer" },
	}
	for _, hosts := range [][]string{{"*.example.com"}, {"*.github.com", "api.example.co.uk"}, {"*.pythonhosted.org"}} {
		s := ok
		s.Hosts = hosts
		if err := s.Validate(); err != nil {
			t.Errorf("hosts %v: %v", hosts, err)
		}
	}
	for i, f := range bad {
		s := ok
		f(&s)
		err := s.Validate()
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("case %d: %v", i, err)
		}
		if err != nil && bytes.Contains([]byte(err.Error()), []byte("X-Evil")) {
			t.Errorf("case %d: error holds the value", i)
		}
	}
	if !regexp.MustCompile(`^space_ph_[0-9a-f]{32}$`).MatchString(NewPlaceholder()) || NewPlaceholder() == NewPlaceholder() {
		t.Error("placeholder shape")
	}
}

func TestCAStorePersists(t *testing.T) {
	dir := t.TempDir()
	st, err := NewCAStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := st.Get("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	st2, _ := NewCAStore(dir)
	ca2, err := st2.Get("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca.CertPEM(), ca2.CertPEM()) || !ca.key.Equal(ca2.key) {
		t.Fatal("CA changed across reopen")
	}
	other, _ := st2.Get("sb-2")
	if bytes.Equal(other.CertPEM(), ca.CertPEM()) {
		t.Fatal("sandboxes share a CA")
	}
	// The leaf chains to the CA, for the requested name only.
	leaf, err := ca2.leaf("api.github.com", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.Leaf.VerifyHostname("api.github.com"); err != nil {
		t.Error(err)
	}
	if err := leaf.Leaf.CheckSignatureFrom(ca.cert); err != nil {
		t.Error(err)
	}
	if again, _ := ca2.leaf("api.github.com", time.Now()); again != leaf {
		t.Error("leaf not cached")
	}
	var _ tls.Certificate = *leaf
	if _, err := st.Get("../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad id: %v", err)
	}
	if err := st2.Delete("sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sb-1.ca.json")); !os.IsNotExist(err) {
		t.Error("CA file not deleted")
	}
}

func TestRing(t *testing.T) {
	r := NewRing(3)
	for i := range 5 {
		r.Audit(Record{SandboxID: "a", Port: i})
	}
	r.Audit(Record{SandboxID: "b", Port: 9})
	got := r.Records("a", 0)
	if len(got) != 3 || got[0].Port != 2 || got[2].Port != 4 {
		t.Errorf("%+v", got)
	}
	if got := r.Records("a", 2); len(got) != 2 || got[0].Port != 3 {
		t.Errorf("limit: %+v", got)
	}
	r.Forget("a")
	if r.Records("a", 0) != nil || len(r.Records("b", 0)) != 1 {
		t.Error("Forget")
	}
}
