package agentproto

// The agent's connection is authenticated per boot (version 9). A driver
// that can keep a file from the sandbox's own code gives the agent a
// secret at boot (--auth-file, AuthFile in the guest: root-only, read once
// and kept in memory); the host keeps its copy with the sandbox's state
// and its checkpoints. On every connection, before the yamux session, the
// host sends a challenge (AuthMagic and a random nonce in hex, one line)
// and the agent answers HMAC-SHA256(secret, AuthMagic+nonce) in hex, one
// line; the host drops a connection that answers anything else. Both
// lines have a fixed length, so neither side reads more than that.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
)

// AuthFile is where a driver puts the agent's secret inside the sandbox.
const AuthFile = "/.space/run/agent.secret"

// SecretSize is the size of an agent secret in bytes.
const SecretSize = 32

// AuthMagic starts both lines of the handshake.
const AuthMagic = "SPACE-AGENT-AUTH/1 "

const (
	nonceSize = 32
	authLine  = len(AuthMagic) + 2*sha256.Size + 1 // the nonce is as long as a MAC
)

// ErrAuth is the error of a connection that did not prove it holds the
// agent's secret.
var ErrAuth = errors.New("agentproto: the agent did not authenticate")

// NewSecret returns a fresh agent secret.
func NewSecret() []byte {
	b := make([]byte, SecretSize)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return b
}

// ReadSecret reads a secret file written for the agent.
func ReadSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, SecretSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) != SecretSize {
		return nil, fmt.Errorf("agentproto: %s holds %d bytes, not a secret of %d", path, len(b), SecretSize)
	}
	return b, nil
}

func authMAC(secret, nonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(AuthMagic))
	m.Write(nonce)
	return m.Sum(nil)
}

func writeLine(w io.Writer, b []byte) error {
	line := make([]byte, 0, authLine)
	line = append(line, AuthMagic...)
	line = hex.AppendEncode(line, b)
	line = append(line, '\n')
	_, err := w.Write(line)
	return err
}

// readLine reads one handshake line (exactly authLine bytes) and returns
// its decoded value.
func readLine(r io.Reader) ([]byte, error) {
	var line [authLine]byte
	if _, err := io.ReadFull(r, line[:]); err != nil {
		return nil, err
	}
	if string(line[:len(AuthMagic)]) != AuthMagic || line[authLine-1] != '\n' {
		return nil, ErrAuth
	}
	b := make([]byte, sha256.Size)
	if _, err := hex.Decode(b, line[len(AuthMagic):authLine-1]); err != nil {
		return nil, ErrAuth
	}
	return b, nil
}

// Authenticate is the host's side of the handshake on a fresh connection:
// nil when the other end proved it holds secret. The caller bounds it in
// time (a deadline on the connection). Errors: ErrAuth for a wrong or
// malformed answer, the connection's own otherwise.
func Authenticate(rw io.ReadWriter, secret []byte) error {
	nonce := make([]byte, nonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	if err := writeLine(rw, nonce); err != nil {
		return err
	}
	mac, err := readLine(rw)
	if err != nil {
		return err
	}
	if !hmac.Equal(mac, authMAC(secret, nonce)) {
		return ErrAuth
	}
	return nil
}

// AnswerAuth is the agent's side of the handshake: it reads the host's
// challenge and answers it with secret.
func AnswerAuth(rw io.ReadWriter, secret []byte) error {
	nonce, err := readLine(rw)
	if err != nil {
		return fmt.Errorf("agent auth: %w", err)
	}
	return writeLine(rw, authMAC(secret, nonce))
}
