package space

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
)

// jsonOutput is what encoding/json makes of an output event's data: the
// reference decodeOutput must agree with.
func jsonOutput(s string) ([]byte, error) {
	var d struct {
		Data    *string `json:"data"`
		DataB64 *string `json:"data_b64"`
	}
	if err := json.Unmarshal([]byte(s), &d); err != nil {
		return nil, err
	}
	return textOrB64(d.Data, d.DataB64)
}

// checkOutput fails when decodeOutput accepts s but disagrees with
// encoding/json, or accepts what encoding/json refuses.
func checkOutput(t *testing.T, s string) (accepted bool) {
	t.Helper()
	got, ok := decodeOutput(s)
	if !ok {
		return false
	}
	want, err := jsonOutput(s)
	if err != nil {
		t.Fatalf("decodeOutput accepted %q, which encoding/json refuses: %v", s, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("decodeOutput(%q) = %q, encoding/json %q", s, got, want)
	}
	return true
}

// randomText is text as programs print it, with what JSON must escape and
// what encoding/json escapes without having to (<, >, &, U+2028).
func randomText(r *rand.Rand) string {
	pieces := []string{"a", "Z", " ", "\n", "\t", "\r", "\"", "\\", "/", "\x00", "\x1b[0m", "\x7f", "<", ">", "&",
		"é", "日本", "\u2028", "\u2029", "😀", "\ufffd", "\xff", "\xc3"}
	var b bytes.Buffer
	for range r.IntN(200) {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

// TestDecodeOutput: on what the server sends (encoding/json's encoding,
// valid or not as UTF-8, and base64) and on hand-made escapes (every short
// escape, \u in both cases, surrogate pairs, lone and broken surrogates),
// decodeOutput gives encoding/json's bytes; on malformed data it declines.
func TestDecodeOutput(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	accepted := 0
	for range 3000 {
		text := randomText(r)
		enc, _ := json.Marshal(map[string]string{"data": text})
		if checkOutput(t, string(enc)) {
			accepted++
		}
		b64, _ := json.Marshal(map[string][]byte{"data_b64": []byte(text)})
		if !checkOutput(t, string(b64)) {
			t.Fatalf("declined base64 %s", b64)
		}
	}
	if accepted < 2000 {
		t.Errorf("the fast path took %d of 3000 server encodings", accepted)
	}
	for _, s := range []string{
		`{"data":""}`, `{"data_b64":""}`,
		`{"data":"\" \\ \/ \b \f \n \r \t"}`,
		`{"data":"\u0041\u00e9\u00E9\u65e5\u2028"}`,
		`{"data":"\ud83d\ude00"}`, `{"data":"\uD83D\uDE00x"}`,
		`{"data":"\ud83d"}`, `{"data":"\ude00"}`, `{"data":"\ud83dx"}`, `{"data":"\ud83d\u0041"}`, `{"data":"\ud83d\ud83d\ude00"}`,
		`{"data":"a\\"}`, `{"data":"ends with a quote\""}`,
	} {
		if !checkOutput(t, s) {
			t.Errorf("declined %s", s)
		}
	}
	for _, s := range []string{
		`{"data":"a"b"}`, `{"data":"a\"}`, `{"data":"\x"}`, `{"data":"\u12"}`, `{"data":"\u12g4"}`,
		"{\"data\":\"a\nb\"}", "{\"data\":\"\xff\"}", `{"data_b64":"!!!!"}`, `{"data_b64":"YQ=\"="}`,
		`{"data": "spaced"}`, `{"data":"x","extra":1}`, `{"data":"x"`, `"data"`, ``,
	} {
		if checkOutput(t, s) {
			t.Errorf("accepted %s", s)
		}
	}
}

// FuzzDecodeOutput: whatever the input, decodeOutput either declines or
// agrees with encoding/json.
func FuzzDecodeOutput(f *testing.F) {
	f.Add(`{"data":"a\nb\u00e9\ud83d\ude00"}`)
	f.Add(`{"data_b64":"` + base64.StdEncoding.EncodeToString([]byte("\x00\xff")) + `"}`)
	f.Add(fmt.Sprintf(`{"data":%q}`, "tab\there"))
	f.Fuzz(func(t *testing.T, s string) { checkOutput(t, s) })
}
