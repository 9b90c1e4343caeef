package httpapi

import (
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/agentproto"
)

// appendOutputEvent appends one stdout/stderr event in the API's SSE
// shape ("id: …\nevent: stdout\ndata: {\"data\":\"…\"}\n\n"), the same
// bytes writeSSE would produce, without reflection, a string copy of the
// chunk or a separate pass to classify it: streaming output is the one
// place the server touches every byte a sandbox prints (profiled: the
// generic JSON path was half the server's CPU in a 256 MiB stream).
//
// A chunk goes out as JSON text when it is valid UTF-8 and at most a
// quarter control bytes (tab, CR, LF and ESC do not count: JSON escapes
// each other one as six bytes, so 256 MiB of zeros would be 1.5 GB of
// text; base64 is 1.33×), else as data_b64.
func appendOutputEvent(dst []byte, e agentproto.Event) []byte {
	dst = append(dst, "id: "...)
	dst = strconv.AppendUint(dst, e.Seq, 10)
	dst = append(dst, "\nevent: "...)
	dst = append(dst, e.Type...)
	dst = append(dst, "\ndata: "...)
	start := len(dst)
	if utf8.Valid(e.Data) {
		dst = append(dst, `{"data":"`...)
		var ok bool
		if dst, ok = appendJSONText(dst, e.Data); ok {
			return append(dst, "\"}\n\n"...)
		}
		dst = dst[:start]
	}
	dst = append(dst, `{"data_b64":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, e.Data)
	return append(dst, "\"}\n\n"...)
}

const (
	swarLo = 0x0101010101010101
	swarHi = 0x8080808080808080
)

// plain8 reports whether none of the 8 bytes in x needs a look: no byte
// below 0x20, no '"', no '\\', nothing outside ASCII.
func plain8(x uint64) bool {
	ctl := (x - swarLo*0x20) & ^x
	q := x ^ (swarLo * '"')
	q = (q - swarLo) & ^q
	bs := x ^ (swarLo * '\\')
	bs = (bs - swarLo) & ^bs
	return (ctl|q|bs|x)&swarHi == 0
}

const hexDigits = "0123456789abcdef"

// appendJSONText appends s (valid UTF-8) escaped as the body of a JSON
// string exactly as encoding/json does with HTML escaping off. It gives
// up (false) as soon as more than a quarter of s is control bytes that
// are not tab, CR, LF or ESC.
func appendJSONText(dst, s []byte) ([]byte, bool) {
	return appendJSONTextLimit(dst, s, len(s)/4)
}

// appendJSONTextLimit is appendJSONText giving up past limit control bytes.
func appendJSONTextLimit(dst, s []byte, limit int) ([]byte, bool) {
	ctl := 0
	run := 0 // start of the bytes not yet copied
	i := 0
	for i < len(s) {
		if i+8 <= len(s) && plain8(binary.LittleEndian.Uint64(s[i:])) {
			i += 8
			continue
		}
		c := s[i]
		switch {
		case c >= 0x20 && c != '"' && c != '\\' && c < 0x80:
			i++
			continue
		case c >= 0x80:
			// U+2028 and U+2029 are escaped by encoding/json (they end
			// lines in JavaScript); every other rune passes as is.
			if c == 0xE2 && i+2 < len(s) && s[i+1] == 0x80 && s[i+2]&^1 == 0xA8 {
				dst = append(dst, s[run:i]...)
				dst = append(dst, `\u202`...)
				dst = append(dst, hexDigits[s[i+2]&0xF])
				i += 3
				run = i
				continue
			}
			i++
			continue
		}
		dst = append(dst, s[run:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\b':
			ctl++
			dst = append(dst, '\\', 'b')
		case '\f':
			ctl++
			dst = append(dst, '\\', 'f')
		default:
			if c != 0x1b {
				ctl++
			}
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		if ctl > limit {
			return dst, false
		}
		i++
		run = i
	}
	return append(dst, s[run:]...), true
}

// appendJSONTextAll is appendJSONText without its give-up rule, for text
// already judged textual as a whole (a piece of it may be denser in
// control bytes than the whole).
func appendJSONTextAll(dst, s []byte) []byte {
	dst, _ = appendJSONTextLimit(dst, s, len(s))
	return dst
}

// controlBytes counts the control bytes textual holds against a text: all
// but tab, CR, LF and ESC.
func controlBytes(data []byte) int {
	ctl := 0
	for _, c := range data {
		if c < 0x20 && c != '\t' && c != '\r' && c != '\n' && c != 0x1b {
			ctl++
		}
	}
	return ctl
}
