package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/agentproto"
)

// execResult.write produces what encoding/json made of the old result
// struct (output copied into strings): same bytes, text or base64 chosen
// the same way, pieces cut anywhere (U+2028 on a cut too).
func TestExecResultWrite(t *testing.T) {
	type oldResult struct {
		PID       int    `json:"pid"`
		ExitCode  int    `json:"exit_code"`
		Signal    string `json:"signal,omitempty"`
		Error     string `json:"error,omitempty"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		StdoutB64 string `json:"stdout_b64,omitempty"`
		StderrB64 string `json:"stderr_b64,omitempty"`
		Truncated bool   `json:"truncated,omitempty"`
	}
	alphabet := []string{"a", "é", "\u2028", "\u2029", "\n", "\t", "\"", "\\", "\x00", "\x1b", "<>&", "\xff", "日本"}
	gen := func(r *rand.Rand) []byte {
		var b bytes.Buffer
		for range r.IntN(40) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.Bytes()
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		res := execResult{PID: r.IntN(1000), ExitCode: r.IntN(300) - 1, Truncated: r.IntN(2) == 0}
		if r.IntN(3) == 0 {
			res.Signal, res.Error = "SIGKILL", "oom"
		}
		stdout, stderr := gen(r), gen(r)
		want := oldResult{PID: res.PID, ExitCode: res.ExitCode, Signal: res.Signal, Error: res.Error, Truncated: res.Truncated}
		for _, s := range []struct {
			b         []byte
			text, b64 *string
		}{{stdout, &want.Stdout, &want.StdoutB64}, {stderr, &want.Stderr, &want.StderrB64}} {
			if textual(s.b) {
				*s.text = string(s.b)
			} else {
				*s.b64 = base64.StdEncoding.EncodeToString(s.b)
			}
		}
		var exp bytes.Buffer
		enc := json.NewEncoder(&exp)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(want); err != nil {
			t.Fatal(err)
		}
		// Cut into chunks anywhere, runes included, as reads cut output.
		cut := func(b []byte) *chunks {
			var c chunks
			for len(b) > 0 {
				n := min(len(b), 1+r.IntN(7))
				c.add(b[:n])
				b = b[n:]
			}
			return &c
		}
		rec := httptest.NewRecorder()
		res.write(rec, cut(stdout), cut(stderr))
		if got := rec.Body.String(); got != exp.String() {
			t.Fatalf("case %d (stdout %q, stderr %q):\n got %s\nwant %s", i, stdout, stderr, got, exp.String())
		}
	}
}

// TestTruncatedEventHasNoID: the SSE "truncated" event carries no id: its
// seq is that of the first event kept, which follows with the same id, and
// a client resuming after the truncated one (Last-Event-ID) skipped it.
func TestTruncatedEventHasNoID(t *testing.T) {
	out := string(appendEvent(nil, agentproto.Event{Type: agentproto.EventTruncated, Seq: 5}))
	if !strings.Contains(out, "event: truncated") || strings.Contains(out, "id:") || !strings.Contains(out, `"first_seq":5`) {
		t.Errorf("truncated event %q", out)
	}
	out = string(appendEvent(nil, agentproto.Event{Type: agentproto.EventStdout, Seq: 5, Data: []byte("x")}))
	if !strings.Contains(out, "id: 5") {
		t.Errorf("the next event %q has no id", out)
	}
}
