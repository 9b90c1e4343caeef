package egress

import (
	"bytes"
	"encoding/base64"
	"strings"
)

// A secret inside base64 text (a basic-auth credential echoed back, a
// token in a JWT-like blob) is found at any offset: the value's bytes can
// start at any of the three byte positions of a 3-byte group, and the
// text around it (a user name, a prefix) is the sandbox's choice. For each
// alignment the scrubber searches for the characters the value's bits
// alone decide (the core), then checks the whole 4-character groups that
// hold the value, including the partial first and last ones that share
// bits with the text around it: decoded, they must hold the value at that
// alignment. A verified match is rewritten whole, the value's bytes
// replaced by the placeholder's and the groups encoded again, so no bit of
// the value is left in the partial groups and the text stays base64 (an
// echoed credential decodes to user:placeholder). A core of 8 or more
// characters that cannot be verified (the text around it is cut or not
// base64) is replaced on its own; a shorter one is too likely to occur in
// random base64 by chance and is replaced only when verified.

// b64form is one (alignment, alphabet) form of a value in base64 text.
type b64form struct {
	o     int    // bytes of the value's first group that precede it
	lead  int    // characters from the group start to the core
	chars int    // characters of the whole groups holding the value
	value []byte // the secret's value
	ph    []byte // the placeholder, padded to len(value) mod 3
	fall  []byte // the placeholder's core, the replacement of an unverified core of 8 or more
}

// b64Needles returns the base64 forms of value (the cores to search for,
// in the standard and the URL alphabets) with their checks.
func b64Needles(value, placeholder string) []needle {
	ph := placeholder
	for (len(ph)-len(value))%3 != 0 {
		ph += "_" // the length mod 3 kept: what follows stays aligned
	}
	var out []needle
	for o := range 3 {
		first := (8*o + 5) / 6                  // first character fully decided by the value
		last := (8*(o+len(value)))/6 - 1        // last one
		chars := 4 * ((o + len(value) + 2) / 3) // whole groups holding the value
		if last < first {
			continue // too short to decide a character of its own: verified through the partial ones only
		}
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, o), value...))
		core := enc[first : last+1]
		pe := base64.StdEncoding.EncodeToString(append(make([]byte, o), ph...))
		fall := pe[first:min(len(pe), first+len(core))]
		f := &b64form{o: o, lead: first, chars: chars, value: []byte(value), ph: []byte(ph), fall: []byte(fall)}
		out = append(out, needle{core: []byte(core), b64: f, before: first, after: chars - first - len(core)})
		if u := strings.NewReplacer("+", "-", "/", "_").Replace(core); u != core {
			out = append(out, needle{core: []byte(u), b64: f, before: first, after: chars - first - len(core)})
		}
	}
	return out
}

func isB64(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '-' || c == '_'
}

// verify checks the groups around a core found at b[i:] and returns where
// they start and end and their rewrite, or ok false when they do not hold
// the value (or are not all there).
func (f *b64form) verify(b []byte, i int) (start, end int, rewrite []byte, ok bool) {
	start = i - f.lead
	if start < 0 {
		return 0, 0, nil, false
	}
	end = start
	for end < len(b) && end-start < f.chars && isB64(b[end]) {
		end++
	}
	pad := 0
	for end < len(b) && end-start < f.chars && b[end] == '=' && pad < 2 {
		end++
		pad++
	}
	region := b[start : end-pad]
	url := bytes.ContainsAny(region, "-_")
	if url && bytes.ContainsAny(region, "+/") {
		return 0, 0, nil, false
	}
	if len(region)%4 == 1 {
		region = region[:len(region)-1] // a lone character holds no whole byte
	}
	raw := base64.RawStdEncoding
	if url {
		raw = base64.RawURLEncoding
	}
	dec := make([]byte, raw.DecodedLen(len(region)))
	n, err := raw.Decode(dec, region)
	if err != nil || n < f.o+len(f.value) || !bytes.Equal(dec[f.o:f.o+len(f.value)], f.value) {
		return 0, 0, nil, false
	}
	dec = dec[:n]
	nb := make([]byte, 0, n-len(f.value)+len(f.ph))
	nb = append(append(append(nb, dec[:f.o]...), f.ph...), dec[f.o+len(f.value):]...)
	e := raw
	if pad > 0 {
		e = base64.StdEncoding
		if url {
			e = base64.URLEncoding
		}
	}
	return start, end, []byte(e.EncodeToString(nb)), true
}
