package space

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []sseEvent
	}{
		{"simple", "event: stdout\nid: 1\ndata: {\"data\":\"hi\"}\n\n",
			[]sseEvent{{ID: "1", Event: "stdout", Data: `{"data":"hi"}`}}},
		{"multi-line data", "data: a\ndata:b\ndata:  c\n\n",
			[]sseEvent{{Event: "message", Data: "a\nb\n c"}}},
		{"comments and keepalives", ": keepalive\n\n: hello\nevent: x\n: mid\ndata: 1\n\n",
			[]sseEvent{{Event: "x", Data: "1"}}},
		{"CRLF", "event: a\r\nid: 7\r\ndata: 1\r\n\r\nevent: b\r\ndata: 2\r\n\r\n",
			[]sseEvent{{ID: "7", Event: "a", Data: "1"}, {ID: "7", Event: "b", Data: "2"}}},
		{"lone CR", "event: a\rdata: 1\r\r",
			[]sseEvent{{Event: "a", Data: "1"}}},
		{"id persists and resets", "id: 3\ndata: a\n\ndata: b\n\nid\ndata: c\n\n",
			[]sseEvent{{ID: "3", Event: "message", Data: "a"}, {ID: "3", Event: "message", Data: "b"}, {Event: "message", Data: "c"}}},
		{"event without data is dropped", "event: nothing\n\nevent: s\ndata: 1\n\n",
			[]sseEvent{{Event: "s", Data: "1"}}},
		{"unterminated event discarded", "data: 1\n\ndata: 2\n",
			[]sseEvent{{Event: "message", Data: "1"}}},
		{"field without colon, retry ignored", "retry: 10\ndata\n\n",
			[]sseEvent{{Event: "message", Data: ""}}},
		{"colon in value", "data: {\"a\":\"b: c\"}\n\n",
			[]sseEvent{{Event: "message", Data: `{"a":"b: c"}`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One byte at a time exercises CR/LF split across reads.
			for _, r := range []io.Reader{strings.NewReader(tt.in), iotest.OneByteReader(strings.NewReader(tt.in))} {
				sr := newSSEReader(r)
				var got []sseEvent
				for {
					ev, err := sr.Next()
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, ev)
				}
				if !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %#v\nwant %#v", got, tt.want)
				}
			}
		})
	}
}

func TestEventStreamDecode(t *testing.T) {
	in := ": keepalive\n\n" +
		"event: start\nid: 1\ndata: {\"pid\":42}\n\n" +
		"event: stdout\nid: 2\ndata: {\"data\":\"héllo\\n\"}\n\n" +
		"event: stderr\nid: 3\ndata: {\"data_b64\":\"/wA=\"}\n\n" +
		"event: exit\nid: 4\ndata: {\"exit_code\":137,\"signal\":\"SIGKILL\",\"error\":\"timeout\"}\n\n"
	s := newEventStream(io.NopCloser(strings.NewReader(in)))
	want := []Event{
		{Seq: 1, Type: EventStart, PID: 42},
		{Seq: 2, Type: EventStdout, Data: []byte("héllo\n")},
		{Seq: 3, Type: EventStderr, Data: []byte{0xff, 0x00}},
		{Seq: 4, Type: EventExit, ExitCode: 137, Signal: "SIGKILL", Error: "timeout"},
	}
	for i, w := range want {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if !reflect.DeepEqual(ev, w) {
			t.Fatalf("event %d: got %+v want %+v", i, ev, w)
		}
	}
	if _, err := s.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after exit: got %v, want io.EOF", err)
	}
	if s.LastSeq() != 4 {
		t.Fatalf("LastSeq = %d, want 4", s.LastSeq())
	}
}

func TestEventStreamBadID(t *testing.T) {
	s := newEventStream(io.NopCloser(strings.NewReader("event: start\nid: x\ndata: {}\n\n")))
	if _, err := s.Next(); err == nil {
		t.Fatal("want error for non-numeric id")
	}
}

// outputStream is an SSE exec stream as the server writes it: n stdout
// events of size bytes each, text (lines of 100 characters) or base64'd
// binary, then an exit event.
func outputStream(n, size int, binary bool) []byte {
	var b strings.Builder
	chunk := make([]byte, size)
	for i := range chunk {
		chunk[i] = "abcdefghij"[i%10]
		if i%101 == 100 {
			chunk[i] = '\n'
		}
		if binary {
			chunk[i] = byte(i * 7)
		}
	}
	var data []byte
	if binary {
		data, _ = json.Marshal(map[string][]byte{"data_b64": chunk})
	} else {
		data, _ = json.Marshal(map[string]string{"data": string(chunk)})
	}
	b.WriteString("id: 1\nevent: start\ndata: {\"pid\":7}\n\n")
	for i := range n {
		fmt.Fprintf(&b, "id: %d\nevent: stdout\ndata: %s\n\n", i+2, data)
	}
	fmt.Fprintf(&b, "id: %d\nevent: exit\ndata: {\"exit_code\":0}\n\n", n+2)
	return []byte(b.String())
}

// BenchmarkEventStreamStdout decodes a stream of 1 MiB output chunks as
// ExecStream's caller does (b.SetBytes counts the output, not the wire).
func BenchmarkEventStreamStdout(b *testing.B) {
	for _, binary := range []bool{false, true} {
		name := "text"
		if binary {
			name = "binary"
		}
		b.Run(name, func(b *testing.B) {
			const n, size = 16, 1 << 20
			in := outputStream(n, size, binary)
			b.SetBytes(n * size)
			for b.Loop() {
				s := newEventStream(io.NopCloser(bytes.NewReader(in)))
				got := 0
				for {
					ev, err := s.Next()
					if err != nil {
						break
					}
					got += len(ev.Data)
				}
				if got != n*size {
					b.Fatalf("got %d bytes", got)
				}
			}
		})
	}
}

// TestEventStreamLongLines: output events of 300 KB, arriving a few bytes
// or a half read at a time, decode whole (the splitter's memory of what it
// already looked at survives reads that end mid-line and mid-CRLF).
func TestEventStreamLongLines(t *testing.T) {
	for _, binary := range []bool{false, true} {
		in := outputStream(3, 300<<10, binary)
		crlf := bytes.ReplaceAll(in, []byte("\n\n"), []byte("\r\n\r\n"))
		for _, r := range []io.Reader{iotest.HalfReader(bytes.NewReader(in)), iotest.OneByteReader(bytes.NewReader(crlf))} {
			s := newEventStream(io.NopCloser(r))
			var got []int
			for {
				ev, err := s.Next()
				if err != nil {
					if !errors.Is(err, io.EOF) {
						t.Fatal(err)
					}
					break
				}
				if ev.Type == EventStdout {
					got = append(got, len(ev.Data))
				}
			}
			if !reflect.DeepEqual(got, []int{300 << 10, 300 << 10, 300 << 10}) || s.LastSeq() != 5 {
				t.Errorf("binary %v: chunks %v, last seq %d", binary, got, s.LastSeq())
			}
		}
	}
}
