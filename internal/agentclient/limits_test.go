package agentclient_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/spacesandbox/space/internal/agent"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// hostileAgent serves handler as an agent would (HTTP/1.1 on the streams
// of a yamux session over a unix socket) and returns a client of it: an
// impostor answering what it likes.
func hostileAgent(t *testing.T, handler http.Handler) *agentclient.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			cfg := yamux.DefaultConfig()
			cfg.LogOutput = io.Discard
			sess, err := yamux.Server(conn, cfg)
			if err != nil {
				conn.Close()
				continue
			}
			srv := &http.Server{Handler: handler}
			go srv.Serve(sess)
		}
	}()
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, nil)
	t.Cleanup(func() { c.Close() })
	return c
}

// flood is what a hostile agent sends: prefix, then n bytes of 'a' from
// one reused buffer (so the agent's own side allocates next to nothing),
// stopping early when the host stops reading.
func flood(w io.Writer, prefix string, n int) {
	if _, err := io.WriteString(w, prefix); err != nil {
		return
	}
	buf := []byte(strings.Repeat("a", 32<<10))
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := w.Write(buf); err != nil {
			return
		}
	}
}

// floodSize is how much a hostile agent sends; the unbounded reads this
// guards against allocated several times that.
const floodSize = 96 << 20

// allocated returns the bytes the process allocated while f ran (both
// sides of the test: the hostile agent's share is kept small by flood).
// Most of it is yamux's receive buffer churning (up to the stream window
// of 4 MiB, filled before the host reads, reallocated as it grows): about
// 11 MiB for an answer cut at 1 MiB. The bounds below leave room for that;
// the unbounded reads allocated several times floodSize.
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func wantTooLarge(t *testing.T, what string, err error, alloc, bound uint64) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("%s: err = %v, want errdefs.ErrTooLarge", what, err)
	}
	t.Logf("%s: %v; %.1f MiB allocated", what, err, float64(alloc)/(1<<20))
	if alloc > bound {
		t.Errorf("%s: %.1f MiB allocated reading a hostile answer, want at most %d MiB", what, float64(alloc)/(1<<20), bound>>20)
	}
}

// TestHostileUnaryAnswers: an agent answering a unary call with an
// endless JSON value costs the host about the limit, and the call fails
// with ErrTooLarge.
func TestHostileUnaryAnswers(t *testing.T) {
	c := hostileAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case agentproto.PathStats:
			flood(w, `{"cpu_count":1,"large_files":[{"path":"`, floodSize)
		case agentproto.PathInfo:
			flood(w, `{"version":"`, floodSize)
		case agentproto.PathFilesStat:
			flood(w, `{"name":"`, floodSize)
		default:
			if strings.HasPrefix(r.URL.Path, "/v1/processes/") {
				flood(w, `{"pid":1,"cmd":["`, floodSize)
				return
			}
			http.NotFound(w, r)
		}
	}))
	ctx := t.Context()
	var err error
	alloc := allocated(func() { _, err = c.Stats(ctx) })
	wantTooLarge(t, "Stats", err, alloc, 32<<20)
	alloc = allocated(func() { _, err = c.Info(ctx) })
	wantTooLarge(t, "Info", err, alloc, 32<<20)
	alloc = allocated(func() { _, err = c.Stat(ctx, "/x") })
	wantTooLarge(t, "Stat", err, alloc, 32<<20)
	alloc = allocated(func() { _, err = c.Process(ctx, 1) })
	wantTooLarge(t, "Process", err, alloc, 64<<20)
	// The session survives: the next call is answered normally.
	if _, err := c.Stats(ctx); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("Stats after a refused answer: %v", err)
	}
}

// TestHostileLists: a list over its count, and one entry that never ends.
func TestHostileLists(t *testing.T) {
	c := hostileAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case agentproto.PathProcesses:
			if r.URL.Query().Get("many") == "" {
				flood(w, `[{"pid":1,"cmd":["sh"]},{"pid":2,"cmd":["`, floodSize)
				return
			}
		case agentproto.PathFilesList:
			bw := bufio.NewWriter(w)
			bw.WriteString("[")
			for i := range agentclient.MaxListEntries + 5 {
				if i > 0 {
					bw.WriteString(",")
				}
				fmt.Fprintf(bw, `{"name":"f%d","path":"/f%d"}`, i, i)
			}
			bw.WriteString("]")
			bw.Flush()
		default:
			http.NotFound(w, r)
		}
	}))
	ctx := t.Context()
	var err error
	alloc := allocated(func() { _, err = c.Processes(ctx) })
	wantTooLarge(t, "Processes (an endless entry)", err, alloc, 64<<20)
	var n int
	alloc = allocated(func() {
		var l []agentproto.FileInfo
		l, err = c.List(ctx, "/", 1)
		n = len(l)
	})
	if n != 0 {
		t.Errorf("List returned %d entries with its error", n)
	}
	wantTooLarge(t, "List (too many entries)", err, alloc, 64<<20)
}

// TestHostileEventStreams: an event frame claiming 16 MiB that never
// comes, one over the limit, an endless NDJSON line, an endless watch
// event.
func TestHostileEventStreams(t *testing.T) {
	c := hostileAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/events"):
			w.Header().Set("Content-Type", agentproto.EventFramesType)
			var hdr [21]byte
			hdr[0] = 1 // stdout
			binary.BigEndian.PutUint64(hdr[1:], 1)
			binary.BigEndian.PutUint32(hdr[17:], agentproto.MaxFrame)
			if r.URL.Query().Get("from") == "7" { // claims 16 MiB, sends 2
				w.Write(hdr[:])
				flood(w, "", 2<<20)
				return
			}
			w.Write(hdr[:])
			flood(w, "", floodSize)
		case r.URL.Path == agentproto.PathProcesses: // Run of an older agent: NDJSON
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, `{"pid":5}`+"\n")
			flood(w, `{"type":"stdout","seq":1,"data":"`, floodSize)
		case r.URL.Path == agentproto.PathFilesWatch:
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.(http.Flusher).Flush()
			flood(w, `{"path":"`, floodSize)
		default:
			http.NotFound(w, r)
		}
	}))
	ctx := t.Context()
	for _, from := range []uint64{1, 7} {
		var err error
		alloc := allocated(func() {
			es, e := c.Events(ctx, 5, from, false)
			if e != nil {
				err = e
				return
			}
			defer es.Close()
			_, err = es.Next()
		})
		wantTooLarge(t, fmt.Sprintf("Events from %d (a frame over the limit)", from), err, alloc, 32<<20)
	}
	var err error
	alloc := allocated(func() {
		_, es, e := c.Run(ctx, agentproto.StartRequest{Cmd: []string{"true"}})
		if e != nil {
			err = e
			return
		}
		defer es.Close()
		_, err = es.Next()
	})
	wantTooLarge(t, "Run (an endless NDJSON event)", err, alloc, 32<<20)
	alloc = allocated(func() {
		ws, e := c.Watch(ctx, "/", false)
		if e != nil {
			err = e
			return
		}
		defer ws.Close()
		_, err = ws.Next()
	})
	wantTooLarge(t, "Watch (an endless event)", err, alloc, 32<<20)
}

// TestHostileHeadersAndErrors: an endless header block, an endless error
// body.
func TestHostileHeadersAndErrors(t *testing.T) {
	c := hostileAgent(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case agentproto.PathInfo, agentproto.PathConnect:
			conn, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			bw.WriteString("HTTP/1.1 200 OK\r\nX-Long: ")
			bw.Flush()
			flood(conn, "", floodSize)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			flood(w, `{"code":"invalid_argument","message":"`, floodSize)
		}
	}))
	ctx := t.Context()
	var err error
	alloc := allocated(func() { _, err = c.Info(ctx) })
	if err == nil {
		t.Error("Info with an endless header: no error")
	}
	t.Logf("Info (endless header): %v; %.1f MiB", err, float64(alloc)/(1<<20))
	if alloc > 32<<20 {
		t.Errorf("Info (endless header): %.1f MiB allocated", float64(alloc)/(1<<20))
	}
	alloc = allocated(func() {
		var conn net.Conn
		conn, err = c.Connect(ctx, 80)
		if conn != nil {
			conn.Close()
		}
	})
	wantTooLarge(t, "Connect (endless header)", err, alloc, 32<<20)
	alloc = allocated(func() { _, err = c.Stats(ctx) })
	if err == nil {
		t.Error("an endless error body: no error")
	}
	t.Logf("Stats (endless error body): %v; %.1f MiB", err, float64(alloc)/(1<<20))
	if alloc > 32<<20 {
		t.Errorf("Stats (endless error body): %.1f MiB allocated", float64(alloc)/(1<<20))
	}
}

// TestAuthenticatedAgent: a real agent given a secret answers the host's
// challenge before its session, and removes its secret file after the
// first handshake; one given another secret is refused.
func TestAuthenticatedAgent(t *testing.T) {
	for _, tc := range []struct {
		name string
		same bool
	}{{"same secret", true}, {"another secret", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "agent.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			host := agentproto.NewSecret()
			secret := host
			if !tc.same {
				secret = agentproto.NewSecret()
			}
			authFile := filepath.Join(dir, "agent.secret")
			if err := os.WriteFile(authFile, secret, 0o400); err != nil {
				t.Fatal(err)
			}
			read, err := agentproto.ReadSecret(authFile)
			if err != nil {
				t.Fatal(err)
			}
			a := agent.New(agent.Options{Home: dir, AuthSecret: read, AuthFile: authFile})
			defer a.Close()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go a.Serve(ctx, agent.Dial("unix", sock))
			conn, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			err = agentproto.Authenticate(conn, host)
			conn.SetDeadline(time.Time{})
			if !tc.same {
				if !errors.Is(err, agentproto.ErrAuth) {
					t.Errorf("an agent with another secret: %v, want ErrAuth", err)
				}
				conn.Close()
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := agentclient.New(func(context.Context) (net.Conn, error) { return conn, nil }, nil)
			defer c.Close()
			if info, err := c.Info(ctx); err != nil || info.Version != agentproto.Version {
				t.Fatalf("Info after the handshake: %+v %v", info, err)
			}
			if _, err := os.Stat(authFile); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the secret file after the first handshake: %v, want removed", err)
			}
		})
	}
}

// TestHostileStreamFlood: an agent opening streams to the host and
// sending nothing on them gets at most MaxAgentStreams held at once; the
// host closes the others at once.
func TestHostileStreamFlood(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sessions := make(chan *yamux.Session, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		cfg := yamux.DefaultConfig()
		cfg.LogOutput = io.Discard
		sess, err := yamux.Server(conn, cfg)
		if err != nil {
			return
		}
		sessions <- sess
	}()
	c := agentclient.New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, nil)
	defer c.Close()
	c.HandleStreams(func(kind string, conn net.Conn) { conn.Close() })
	sess := <-sessions
	defer sess.Close()
	const extra = 16
	var streams []*yamux.Stream
	for range agentclient.MaxAgentStreams + extra {
		st, err := sess.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	// The host takes streams in the order they were opened: the last
	// ones are over the limit and closed at once (a read sees EOF).
	var b [1]byte
	for _, st := range streams[agentclient.MaxAgentStreams:] {
		if _, err := st.Read(b[:]); !errors.Is(err, io.EOF) {
			t.Fatalf("a stream over the limit: read %v, want EOF", err)
		}
	}
	// The others are held, waiting for their first line (until the
	// host's 10 s deadline for it): a read finds nothing yet.
	held := 0
	for _, st := range streams[:agentclient.MaxAgentStreams] {
		st.SetReadDeadline(time.Now())
		if _, err := st.Read(b[:]); errors.Is(err, yamux.ErrTimeout) {
			held++
		}
	}
	if held != agentclient.MaxAgentStreams {
		t.Errorf("%d of the first %d streams held, want all", held, agentclient.MaxAgentStreams)
	}
}
