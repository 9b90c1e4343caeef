package agentclient

// Everything an agent says is untrusted: the agent runs inside the
// sandbox, and root there can stop it and answer in its place (the
// drivers authenticate the agent's connection, but a compromised agent is
// still the sandbox's own code). So every read of agent data on the host is
// bounded in size, in count and (for unary calls, UnaryTimeout) in time:
// an answer over its limit fails that one call with errdefs.ErrTooLarge,
// and costs the host at most about the limit in memory, never what the
// agent chose to send.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Limits on what the host reads from an agent. Each is well above what a
// real agent sends (its own limits are in the comments).
const (
	// MaxUnaryAnswer bounds a JSON answer (Info, Stats, a FileInfo, a
	// Process…).
	MaxUnaryAnswer = 1 << 20
	// MaxListAnswer and MaxListEntries bound a directory listing (the
	// agent stops at 10,000 entries of at most a few KiB each).
	MaxListAnswer  = 32 << 20
	MaxListEntries = 10_000
	// MaxProcesses bounds a process list (a sandbox's pids limit is far
	// below), within MaxListAnswer bytes.
	MaxProcesses = 65_536
	// MaxListEntry bounds one entry of a list, and one Process: twice
	// the largest command line the API accepts (1 MiB of JSON), for what
	// escaping adds.
	MaxListEntry = 2 << 20
	// MaxEventFrame bounds one binary event frame's payload: the agent
	// reads output in chunks of at most 1 MiB (readChunkMax).
	MaxEventFrame = 1 << 20
	// MaxEventLine bounds one NDJSON event line (older agents): a 1 MiB
	// output chunk is 1.37 MiB once in base64 and JSON.
	MaxEventLine = 2 << 20
	// MaxWatchEvent bounds one file watch event (a path and a few fields).
	MaxWatchEvent = 64 << 10
	// MaxErrorBody bounds an error answer's body.
	MaxErrorBody = 64 << 10
	// MaxHeaderBytes bounds an answer's header block.
	MaxHeaderBytes = 64 << 10
	// MaxAgentStreams bounds the streams the agent has open to the host at
	// once (egress tunnel connections, each with its own receive window).
	MaxAgentStreams = 1024
	// maxStreamKind bounds the first line of a stream the agent opens.
	maxStreamKind = 64
)

// tooLarge is the error of an answer over its limit.
func tooLarge(what string, limit int64, unit string) error {
	return errdefs.Newf(errdefs.ErrTooLarge, "the sandbox's agent sent more than %d %s in %s: refused", limit, unit, what)
}

// capReader reads at most n bytes of r and fails with a tooLarge error
// when r has more, where io.LimitReader would silently cut the answer.
type capReader struct {
	r     io.Reader
	n     int64 // bytes left
	limit int64
	what  string

	// With elemLimit set, also at most elemLimit bytes read since
	// elemStart (one list entry, plus what the decoder reads ahead).
	read      int64
	elemStart int64
	elemLimit int64
}

func newCapReader(r io.Reader, limit int64, what string) *capReader {
	return &capReader{r: r, n: limit, limit: limit, what: what}
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.n <= 0 {
		var b [1]byte
		k, err := c.r.Read(b[:])
		if k > 0 {
			return 0, tooLarge(c.what, c.limit, "bytes")
		}
		return 0, err
	}
	if c.elemLimit > 0 && c.read-c.elemStart > c.elemLimit {
		return 0, tooLarge(c.what, c.elemLimit, "bytes in one entry")
	}
	if int64(len(p)) > c.n {
		p = p[:c.n]
	}
	k, err := c.r.Read(p)
	c.n -= int64(k)
	c.read += int64(k)
	return k, err
}

// decodeOne decodes one JSON value of at most limit bytes from r.
func decodeOne(r io.Reader, limit int64, what string, out any) error {
	return json.NewDecoder(newCapReader(r, limit, what)).Decode(out)
}

// decodeList decodes a JSON array of at most maxItems elements of at most
// MaxListEntry bytes, limit bytes in all, from r, one element at a time:
// a count over the limit is refused before the elements past it are
// decoded, and an endless element after MaxListEntry bytes. null is an
// empty list.
func decodeList[T any](r io.Reader, limit int64, maxItems int, what string) ([]T, error) {
	cr := newCapReader(r, limit, what)
	cr.elemLimit = MaxListEntry
	dec := json.NewDecoder(cr)
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if tok == nil {
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fmt.Errorf("%s: not a JSON array", what)
	}
	var out []T
	for dec.More() {
		if len(out) == maxItems {
			return nil, tooLarge(what, int64(maxItems), "entries")
		}
		// The element starts after what the decoder holds unread.
		cr.elemStart = cr.read
		if b, ok := dec.Buffered().(interface{ Len() int }); ok {
			cr.elemStart -= int64(b.Len())
		}
		var v T
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return out, nil
}

// readLine returns the next non-empty line of br (without its newline),
// refusing one longer than limit bytes. A last line without a newline is
// returned with a nil error; io.EOF only when nothing is left. The result
// is valid until the next read of br.
func readLine(br *bufio.Reader, limit int, what string) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > limit+1 { // +1: the newline
			return nil, tooLarge(what, int64(limit), "bytes in one line")
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, frag...)
			continue
		}
		if line == nil {
			line = frag
		} else {
			line = append(line, frag...)
		}
		if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
			return nil, err
		}
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
		}
		if len(bytes.TrimSpace(line)) == 0 {
			if err != nil {
				return nil, io.EOF
			}
			line = nil
			continue
		}
		return line, nil
	}
}

// decodeLine reads one NDJSON line of at most limit bytes into out.
func decodeLine(br *bufio.Reader, limit int, what string, out any) error {
	line, err := readLine(br, limit, what)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(line, out); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
