package mcp

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	space "github.com/spacesandbox/space/sdk/go"
)

func TestTruncate(t *testing.T) {
	const uri = "space://sandboxes/sb-x/commands/7/output"
	if s, cut := truncate([]byte("short"), 16, uri); s != "short" || cut {
		t.Errorf("short output: %q %v", s, cut)
	}
	// Multi-byte runes at both cut points stay whole.
	in := strings.Repeat("é", 20) // 40 bytes
	s, cut := truncate([]byte(in), 11, uri)
	if !cut || !utf8.ValidString(s) {
		t.Fatalf("cut=%v valid=%v %q", cut, utf8.ValidString(s), s)
	}
	head, rest, ok := strings.Cut(s, "\n[... ")
	if !ok || !strings.Contains(rest, "bytes truncated; full output: "+uri+" ...]\n") {
		t.Fatalf("no marker in %q", s)
	}
	tail := rest[strings.Index(rest, "]\n")+2:]
	if head != strings.Repeat("é", 2) || tail != strings.Repeat("é", 2) {
		t.Errorf("head %q tail %q", head, tail)
	}
	if want := fmt.Sprintf("%d bytes truncated", 40-8); !strings.Contains(s, want) {
		t.Errorf("%q does not say %q", s, want)
	}
	// Invalid UTF-8 is replaced, not passed on.
	if s, _ := truncate([]byte{'a', 0xff, 'b'}, 16, uri); s != "a\uFFFDb" {
		t.Errorf("invalid UTF-8: %q", s)
	}
}

func TestCodeResult(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nfake")
	msg := func(s string) string { return "\x1e" + s + "\n" }
	out := "raw line\n" +
		msg(`{"type":"number_of_executions","execution_count":1}`) +
		msg(`{"type":"stdout","text":"hello\n"}`) +
		msg(`{"type":"stderr","text":"warn\n"}`) +
		msg(`{"type":"result","text":"<Figure>","png":"`+base64.StdEncoding.EncodeToString(png)+`"}`) +
		msg(`{"type":"result","text":"42","is_main_result":true}`) +
		msg(`{"type":"result","markdown":"**bold**"}`) +
		msg(`{"type":"end_of_execution"}`)
	r := codeResult("sb-x", &space.ExecResult{PID: 3, Stdout: []byte(out)})
	if r.IsError {
		t.Fatalf("IsError for a run that ended: %+v", r)
	}
	var texts []string
	var img *mcp.ImageContent
	for _, c := range r.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			texts = append(texts, c.Text)
		case *mcp.ImageContent:
			img = c
		}
	}
	if got := strings.Join(texts, "|"); got != "stdout:\nraw line\nhello\n|stderr:\nwarn\n|<Figure>|42|**bold**" {
		t.Errorf("texts: %q", got)
	}
	if img == nil || img.MIMEType != "image/png" || string(img.Data) != string(png) {
		t.Errorf("image: %+v", img)
	}

	// An exception is a tool error with its traceback; a kernel that died
	// before the end says so.
	r = codeResult("sb-x", &space.ExecResult{Stdout: []byte(msg(`{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback…"}`) + msg(`{"type":"end_of_execution"}`))})
	if !r.IsError || !strings.Contains(r.Content[len(r.Content)-1].(*mcp.TextContent).Text, "ZeroDivisionError: division by zero") {
		t.Errorf("exception: %+v", r.Content)
	}
	r = codeResult("sb-x", &space.ExecResult{ExitCode: -1, Error: "timeout", Stdout: []byte(msg(`{"type":"stdout","text":"partial"}`))})
	if !r.IsError || !strings.Contains(r.Content[len(r.Content)-1].(*mcp.TextContent).Text, "timeout") {
		t.Errorf("unfinished run: %+v", r.Content)
	}
}

func TestParseURI(t *testing.T) {
	id, rest, err := parseURI(fileURI("sb-a", "/home/user/a b.txt"), "files")
	if err != nil || id != "sb-a" || rest != "home/user/a b.txt" {
		t.Errorf("file uri: %q %q %v", id, rest, err)
	}
	id, rest, err = parseURI(commandURI("sb-a", 12), "commands")
	if err != nil || id != "sb-a" || rest != "12/output" {
		t.Errorf("command uri: %q %q %v", id, rest, err)
	}
	for _, bad := range []string{"http://sandboxes/sb-a/files/x", "space://other/sb-a/files/x", "space://sandboxes/files/x", "space://sandboxes/sb-a/commands/1"} {
		if _, _, err := parseURI(bad, "files"); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

// TestHandlerTransport: the in-process transport passes status, headers
// and a streamed body, each flushed write readable before the handler
// returns, and cancels the handler's context when the body is closed.
func TestHandlerTransport(t *testing.T) {
	step := make(chan struct{})
	cancelled := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" || r.URL.Path != "/v1/x" || r.URL.Query().Get("q") != "1" || r.RemoteAddr != "192.0.2.7:4242" {
			http.Error(w, "bad request "+r.URL.String(), 400)
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Got", string(body))
		w.WriteHeader(201)
		fmt.Fprintln(w, "first")
		w.(http.Flusher).Flush()
		<-step
		fmt.Fprintln(w, "second")
		<-r.Context().Done()
		close(cancelled)
	})
	hc := &http.Client{Transport: handlerTransport{h: h, remote: "192.0.2.7:4242"}}
	req, _ := http.NewRequest("POST", inProcessURL+"/v1/x?q=1", strings.NewReader("payload"))
	req.Header.Set("Authorization", "Bearer k")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 201 || resp.Header.Get("X-Got") != "payload" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	if l, _ := br.ReadString('\n'); l != "first\n" {
		t.Fatalf("first line %q", l)
	}
	close(step)
	if l, _ := br.ReadString('\n'); l != "second\n" {
		t.Fatalf("second line %q", l)
	}
	resp.Body.Close()
	<-cancelled

	// A request whose context ends before any answer fails with it.
	ctx, cancel := context.WithCancel(context.Background())
	block := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	req, _ = http.NewRequestWithContext(ctx, "GET", inProcessURL+"/", nil)
	cancel()
	if _, err := (&http.Client{Transport: handlerTransport{h: block}}).Do(req); err == nil {
		t.Error("cancelled request succeeded")
	}
}
