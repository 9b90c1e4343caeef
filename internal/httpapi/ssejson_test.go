package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/agentproto"
)

// referenceOutputEvent is the generic path appendOutputEvent replaces:
// classify, then encoding/json. The fast path must produce the same bytes.
func referenceOutputEvent(e agentproto.Event) []byte {
	text := utf8.Valid(e.Data)
	if text {
		ctl := 0
		for _, c := range e.Data {
			if c < 0x20 && c != '\n' && c != '\r' && c != '\t' && c != 0x1b {
				ctl++
			}
		}
		text = ctl*4 <= len(e.Data)
	}
	var buf bytes.Buffer
	if text {
		writeSSE(&buf, strconv.FormatUint(e.Seq, 10), e.Type, map[string]string{"data": string(e.Data)})
	} else {
		writeSSE(&buf, strconv.FormatUint(e.Seq, 10), e.Type, map[string]string{"data_b64": base64.StdEncoding.EncodeToString(e.Data)})
	}
	return buf.Bytes()
}

func TestAppendOutputEventMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", " ", "\"", "\\", "\n", "\r", "\t", "\x1b", "\x00", "\x01", "\b", "\f", "\x1f", "\x7f",
		"é", "日本", "\u2028", "\u2029", "\u2027", "\xe2\x80", "😀", "<", ">", "&", "\xff", "\xc3"}
	var cases [][]byte
	cases = append(cases, nil, []byte{}, bytes.Repeat([]byte{0}, 1000), []byte(strings.Repeat("yes abcdefghijklmnopqrstuvwxyz\n", 100)),
		[]byte("\x1b[31mred\x1b[0m\n"), []byte("a\x00b\x00c\x00d\x00"), []byte("ab\x00cd\x00ef\x00gh\x00ijkl\x00"))
	for i := 0; i < 3000; i++ {
		n := r.IntN(200)
		var b []byte
		// Long plain runs so the 8-byte path and its edges are exercised.
		for len(b) < n {
			if r.IntN(3) == 0 {
				b = append(b, alphabet[r.IntN(len(alphabet))]...)
			} else {
				b = append(b, strings.Repeat("x", r.IntN(20))...)
			}
		}
		cases = append(cases, b)
	}
	for i := 0; i < 200; i++ {
		b := make([]byte, r.IntN(100))
		for j := range b {
			b[j] = byte(r.IntN(256))
		}
		cases = append(cases, b)
	}
	for i, data := range cases {
		for _, typ := range []string{agentproto.EventStdout, agentproto.EventStderr} {
			e := agentproto.Event{Type: typ, Seq: uint64(i) * 977, Data: data}
			got, want := appendOutputEvent([]byte("prefix"), e), append([]byte("prefix"), referenceOutputEvent(e)...)
			if !bytes.Equal(got, want) {
				t.Fatalf("case %d %q:\n got %q\nwant %q", i, data, got, want)
			}
			// And it decodes back to the chunk.
			line := got[bytes.Index(got, []byte("data: "))+6:]
			var d struct {
				Data    *string `json:"data"`
				DataB64 []byte  `json:"data_b64"`
			}
			if err := json.Unmarshal(bytes.TrimSpace(line), &d); err != nil {
				t.Fatalf("case %d: %v: %q", i, err, line)
			}
			if d.Data != nil && *d.Data != string(data) || d.Data == nil && !bytes.Equal(d.DataB64, data) {
				t.Fatalf("case %d does not round-trip: %q", i, line)
			}
			// The JSON exec (collect) classifies whole outputs by the same rule.
			if textual(data) != (d.Data != nil) {
				t.Fatalf("case %d %q: textual %v, but the SSE event chose text=%v", i, data, textual(data), d.Data != nil)
			}
		}
	}
}

func BenchmarkOutputEvent(b *testing.B) {
	chunk := bytes.Repeat([]byte("yes abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ\n"), 4000)
	e := agentproto.Event{Type: agentproto.EventStdout, Seq: 7, Data: chunk}
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(chunk)))
		var out []byte
		for i := 0; i < b.N; i++ {
			out = appendOutputEvent(out[:0], e)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(chunk)))
		for i := 0; i < b.N; i++ {
			referenceOutputEvent(e)
		}
	})
}

// textual, the reference the encoders are checked against, reports whether data goes out as JSON text rather than base64
// (the rule appendOutputEvent applies to each chunk): valid UTF-8 and at
// most a quarter control bytes other than tab, CR, LF and ESC.
func textual(data []byte) bool {
	return utf8.Valid(data) && controlBytes(data) <= len(data)/4
}
