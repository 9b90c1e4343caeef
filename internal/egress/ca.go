package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// CA is one sandbox's interception authority: an ECDSA P-256 certificate
// the sandbox trusts, and a key that never leaves the host.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey

	mu      sync.Mutex
	leafKey *ecdsa.PrivateKey
	leaves  map[string]*tls.Certificate
}

// CertPEM is the CA certificate to install in the sandbox trust store.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.certPEM...) }

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func newCA(sandboxID string, now time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"space"}, CommonName: "space egress CA " + sandboxID},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(5, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return caFrom(der, key)
}

func caFrom(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
		leaves:  map[string]*tls.Certificate{},
	}, nil
}

// leaf returns a cached or fresh certificate for host, signed by ca.
func (ca *CA) leaf(host string, now time.Time) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok && now.Before(c.Leaf.NotAfter.Add(-time.Hour)) {
		return c, nil
	}
	if ca.leafKey == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		ca.leafKey = k
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
	if len(ca.leaves) >= 1024 {
		clear(ca.leaves)
	}
	ca.leaves[host] = c
	return c, nil
}

var sandboxIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// CAStore keeps one CA per sandbox. With a directory, each CA is a
// "<sandbox>.ca.json" file holding the certificate and the private key
// sealed with AES-256-GCM under dir/ca.key (0600), so a restarted server
// keeps using the CA already installed in running sandboxes. Without a
// directory CAs live in memory only. Safe for concurrent use.
type CAStore struct {
	dir  string
	seal *sealer
	now  func() time.Time

	mu  sync.Mutex
	cas map[string]*CA
}

type caFile struct {
	Cert []byte `json:"cert_der"`
	Key  []byte `json:"sealed_key"`
}

// NewCAStore opens a store in dir ("" for memory only).
func NewCAStore(dir string) (*CAStore, error) {
	st := &CAStore{dir: dir, now: time.Now, cas: map[string]*CA{}}
	if dir != "" {
		s, err := openSealer(dir, "ca.key")
		if err != nil {
			return nil, err
		}
		st.seal = s
	}
	return st, nil
}

// Get returns the sandbox's CA, loading or creating it
// (errdefs.ErrInvalidArgument for a malformed id).
func (st *CAStore) Get(sandboxID string) (*CA, error) {
	if !sandboxIDRE.MatchString(sandboxID) {
		return nil, errdefs.InvalidArgument("sandbox id %q is not valid", sandboxID)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if ca, ok := st.cas[sandboxID]; ok {
		return ca, nil
	}
	if st.dir != "" {
		ca, err := st.load(sandboxID)
		if err == nil {
			st.cas[sandboxID] = ca
			return ca, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	ca, err := newCA(sandboxID, st.now())
	if err != nil {
		return nil, err
	}
	if st.dir != "" {
		kder, err := x509.MarshalPKCS8PrivateKey(ca.key)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(caFile{Cert: ca.cert.Raw, Key: st.seal.seal(kder, []byte(sandboxID))})
		if err != nil {
			return nil, err
		}
		if err := writeFileAtomic(st.path(sandboxID), b); err != nil {
			return nil, fmt.Errorf("egress: store CA: %w", err)
		}
	}
	st.cas[sandboxID] = ca
	return ca, nil
}

func (st *CAStore) path(id string) string { return filepath.Join(st.dir, id+".ca.json") }

func (st *CAStore) load(id string) (*CA, error) {
	b, err := os.ReadFile(st.path(id))
	if err != nil {
		return nil, err
	}
	var f caFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("egress: CA of %s: %w", id, errdefs.ErrInternal)
	}
	kder, err := st.seal.open(f.Key, []byte(id))
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kder)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("egress: CA key of %s is not ECDSA: %w", id, errdefs.ErrInternal)
	}
	return caFrom(f.Cert, ek)
}

// Delete forgets a sandbox's CA (memory and disk); a missing one is not an error.
func (st *CAStore) Delete(sandboxID string) error {
	if !sandboxIDRE.MatchString(sandboxID) {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.cas, sandboxID)
	if st.dir == "" {
		return nil
	}
	if err := os.Remove(st.path(sandboxID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
