package space

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestProcessesStdinSignal(t *testing.T) {
	var gotStdin, gotSignal string
	var gotEOF bool
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/sandboxes/sb1/processes":
			io.WriteString(w, `{"processes":[{"pid":5,"cmd":["sleep","9"],"user":"root","cwd":"/","pty":false,"started_at":"2025-01-01T00:00:00Z","running":false,"exit_code":0,"exited_at":"2025-01-01T00:00:09Z"}]}`)
		case "POST /v1/sandboxes/sb1/processes/5/stdin":
			if r.Header.Get("Content-Type") != "application/octet-stream" {
				t.Errorf("Content-Type = %q", r.Header.Get("Content-Type"))
			}
			b, _ := io.ReadAll(r.Body)
			gotStdin, gotEOF = string(b), r.URL.Query().Get("eof") == "true"
			w.WriteHeader(204)
		case "POST /v1/sandboxes/sb1/processes/5/signal":
			var b struct{ Signal string }
			json.NewDecoder(r.Body).Decode(&b)
			gotSignal = b.Signal
			w.WriteHeader(204)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
		}
	})
	ctx := t.Context()
	ps, err := c.Processes(ctx, "sb1")
	if err != nil || len(ps) != 1 || ps[0].ExitCode == nil || *ps[0].ExitCode != 0 || ps[0].ExitedAt == nil || ps[0].Running {
		t.Fatalf("got %+v %v", ps, err)
	}
	if err := c.SendStdin(ctx, "sb1", 5, strings.NewReader("input"), true); err != nil || gotStdin != "input" || !gotEOF {
		t.Fatalf("stdin %q eof %v err %v", gotStdin, gotEOF, err)
	}
	if err := c.SendStdin(ctx, "sb1", 5, nil, false); err != nil || gotStdin != "" || gotEOF {
		t.Fatalf("empty stdin: %q %v %v", gotStdin, gotEOF, err)
	}
	if err := c.Signal(ctx, "sb1", 5, "SIGTERM"); err != nil || gotSignal != "SIGTERM" {
		t.Fatalf("signal %q %v", gotSignal, err)
	}
}

func TestNewClientBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://h:1":      "http://h:1",
		"http://h:1/":     "http://h:1",
		"http://h:1/v1/":  "http://h:1",
		"https://h/space": "https://h/space",
		"not a url":       "",
	} {
		if got := NewClient(in, "").BaseURL(); got != want {
			t.Errorf("NewClient(%q).BaseURL() = %q, want %q", in, got, want)
		}
	}
	if _, err := NewClient("::", "").GetSandbox(t.Context(), "x"); err == nil {
		t.Fatal("call with a bad URL succeeded")
	}
}
