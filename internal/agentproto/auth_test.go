package agentproto_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/agentproto"
)

// handshake runs the host's side against answer on a pipe.
func handshake(t *testing.T, secret []byte, answer func(c net.Conn)) error {
	t.Helper()
	host, agent := net.Pipe()
	defer host.Close()
	go func() {
		defer agent.Close()
		answer(agent)
	}()
	return agentproto.Authenticate(host, secret)
}

func TestAuth(t *testing.T) {
	secret := agentproto.NewSecret()
	if err := handshake(t, secret, func(c net.Conn) { agentproto.AnswerAuth(c, secret) }); err != nil {
		t.Errorf("the right secret: %v", err)
	}
	other := agentproto.NewSecret()
	if err := handshake(t, secret, func(c net.Conn) { agentproto.AnswerAuth(c, other) }); !errors.Is(err, agentproto.ErrAuth) {
		t.Errorf("another secret: %v, want ErrAuth", err)
	}
	// An impostor that echoes the challenge, or answers JSON.
	echo := func(c net.Conn) { io.Copy(c, c) }
	if err := handshake(t, secret, echo); !errors.Is(err, agentproto.ErrAuth) {
		t.Errorf("an echo: %v, want ErrAuth", err)
	}
	junk := func(c net.Conn) {
		go io.Copy(io.Discard, c)
		io.WriteString(c, `{"version":"`+strings.Repeat("a", 1<<20))
	}
	if err := handshake(t, secret, junk); !errors.Is(err, agentproto.ErrAuth) {
		t.Errorf("endless JSON: %v, want ErrAuth", err)
	}
	if err := handshake(t, secret, func(c net.Conn) { io.CopyN(io.Discard, c, 10) }); err == nil {
		t.Error("a connection closed at once authenticated")
	}
}
