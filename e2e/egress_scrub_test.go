package e2e

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestEgressReflectingHost: from a real sandbox, against a host that sends
// back what it is given (the Authorization header, the body, ranges of
// it): a basic-auth password under a user the sandbox chose comes back as
// the placeholder however the user shifts it in the base64; ranges cannot
// cut the reflected value into pieces; and a request carrying the value
// itself (a correct guess, which the test hands the sandbox) is refused
// and revokes the secret, so right and wrong guesses then get one answer.
func TestEgressReflectingHost(t *testing.T) {
	const value = "refl-Pass-1234"
	up := startUpstreamWith(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		echo := "auth=" + r.Header.Get("Authorization") + " body=" + string(body) + " end"
		if r.URL.Path == "/ranged" {
			http.ServeContent(w, r, "echo.txt", time.Time{}, strings.NewReader(echo))
			return
		}
		fmt.Fprint(w, echo)
	}))
	s := startServer(t, "", "--egress-hosts", "allowed.test=127.0.0.1", "--egress-allow-cidr", "127.0.0.1/32",
		"--egress-root-ca", up.caFile, "--pool-size", "-1")
	allowed := fmt.Sprintf("allowed.test:%d", up.port)
	if code := s.do("POST", "/v1/secrets", s.key, map[string]any{
		"name": "PW", "value": "short", "hosts": []string{allowed}, "inject": map[string]any{"basic_auth": map[string]any{}},
	}, nil); code != 400 {
		t.Errorf("a 5-byte secret: %d, want 400", code)
	}
	if code := s.do("POST", "/v1/secrets", s.key, map[string]any{
		"name": "PW", "value": value, "hosts": []string{allowed}, "inject": map[string]any{"basic_auth": map[string]any{}},
	}, nil); code != 201 {
		t.Fatalf("put secret: %d", code)
	}
	id := s.create(map[string]any{"network": map[string]any{"allow": []string{allowed}}, "secrets": []string{"PW"}})
	ph := strings.TrimSpace(s.sh(id, "echo $PW").Stdout)

	for _, user := range []string{"", "a", "ab", "abc"} {
		r := s.sh(id, fmt.Sprintf(`curl -sS -u '%s:'"$PW" https://%s/echo`, user, allowed))
		_, cred, _ := strings.Cut(r.Stdout, "auth=Basic ")
		cred, _, _ = strings.Cut(cred, " ")
		dec, err := base64.StdEncoding.DecodeString(cred)
		if r.ExitCode != 0 || err != nil || strings.TrimRight(string(dec), "_") != user+":"+ph || strings.Contains(r.Stdout, value) {
			t.Errorf("user %q: %+v (credential decodes to %q)", user, r, dec)
		}
	}
	var pieces strings.Builder
	for off := 0; off < 40; off += 6 {
		r := s.sh(id, fmt.Sprintf(`curl -sS -r %d-%d -u 'abc:'"$PW" https://%s/ranged`, off, off+5, allowed))
		if !strings.HasPrefix(r.Stdout, "auth=Basic ") || !strings.HasSuffix(r.Stdout, " end") {
			t.Errorf("range %d: %+v, want the whole body", off, r)
		}
		pieces.WriteString(r.Stdout)
	}
	if strings.Contains(pieces.String(), value) {
		t.Errorf("ranges rebuilt the value: %q", pieces.String())
	}

	// A wrong guess comes back as sent; the right one is refused, and
	// from then on every request to the host gets the same refusal.
	if r := s.sh(id, fmt.Sprintf(`curl -sS -u "a:$PW" --data-binary 'letmein refl-Pass-1235' https://%s/echo`, allowed)); !strings.Contains(r.Stdout, "body=letmein refl-Pass-1235 end") {
		t.Fatalf("a wrong guess: %+v", r)
	}
	r := s.sh(id, fmt.Sprintf(`curl -sS -u "a:$PW" --data-binary 'letmein %s' https://%s/echo`, value, allowed))
	if strings.Contains(r.Stdout, "body=") || !strings.Contains(r.Stdout, "revoked") {
		t.Errorf("the right guess: %+v", r)
	}
	var answers []string
	for _, g := range []string{"letmein refl-Pass-1235", "letmein " + value, "nothing"} {
		answers = append(answers, s.sh(id, fmt.Sprintf(`curl -sS -u "a:$PW" --data-binary '%s' https://%s/echo`, g, allowed)).Stdout)
	}
	for _, a := range answers {
		if a != answers[0] || !strings.Contains(a, "secret PW is revoked") {
			t.Errorf("after the guess the answers differ or are not the revocation: %q", answers)
			break
		}
	}
	var log struct {
		Records []struct {
			Reason string `json:"reason"`
			Secret string `json:"secret"`
		}
	}
	s.do("GET", "/v1/sandboxes/"+id+"/egress", s.key, nil, &log)
	found := false
	for _, rec := range log.Records {
		found = found || rec.Reason == "secret_value" && rec.Secret == "PW"
	}
	if !found {
		t.Errorf("no secret_value record: %+v", log.Records)
	}
}
