package mcp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/spacesandbox/space/internal/e2b"
	space "github.com/spacesandbox/space/sdk/go"
)

// kernelMsg is one message of the code interpreter's kernel (see
// internal/e2b/kernel): output, results with their representations,
// errors.
type kernelMsg struct {
	Type      string `json:"type"`
	Text      string `json:"text"`
	PNG       string `json:"png"`
	JPEG      string `json:"jpeg"`
	SVG       string `json:"svg"`
	Markdown  string `json:"markdown"`
	HTML      string `json:"html"`
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// code runs in.Code in the code interpreter's kernel (the one the E2B
// facade runs), started for this call alone: its request on stdin, its
// messages read from the command's output.
func (t *tools) code(ctx context.Context, req *mcp.CallToolRequest, in codeIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(in.Code) == "" {
		return nil, nil, errors.New("code is required")
	}
	file, src, argv, err := e2b.Kernel(in.Language)
	if err != nil {
		return nil, nil, err
	}
	timeout, err := cmdTimeout(in.TimeoutS)
	if err != nil {
		return nil, nil, err
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	if _, err := c.WriteFile(ctx, in.SandboxID, file, bytes.NewReader(src)); err != nil {
		return nil, nil, apiErr("code interpreter", err)
	}
	res, err := c.Exec(ctx, in.SandboxID, space.ExecRequest{Cmd: argv, Env: in.Env, Stdin: string(e2b.KernelRequest(in.Code, nil)), TimeoutS: timeout})
	if err != nil {
		return nil, nil, apiErr("run code", err)
	}
	return codeResult(in.SandboxID, res), nil, nil
}

// codeResult turns the kernel's output into MCP content: the text it
// printed, each result (as text, and as an image when it has one), and an
// error result for an exception.
func codeResult(id string, res *space.ExecResult) *mcp.CallToolResult {
	uri := commandURI(id, res.PID)
	var stdout, stderr strings.Builder
	var content []mcp.Content
	var failed *kernelMsg
	ended := false
	for line := range bytes.Lines(res.Stdout) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		i := bytes.IndexByte(line, e2b.KernelMessageMark)
		if i < 0 {
			stdout.Write(line)
			stdout.WriteByte('\n')
			continue
		}
		stdout.Write(line[:i])
		var m kernelMsg
		if json.Unmarshal(line[i+1:], &m) != nil {
			continue
		}
		switch m.Type {
		case "stdout":
			stdout.WriteString(m.Text)
		case "stderr":
			stderr.WriteString(m.Text)
		case "result":
			// The plain text of a result, else its richest text form.
			if text := cmp.Or(m.Text, m.Markdown, m.HTML); text != "" {
				content = append(content, &mcp.TextContent{Text: text})
			}
			for _, img := range []struct{ data, mime string }{{m.PNG, "image/png"}, {m.JPEG, "image/jpeg"}} {
				if img.data == "" {
					continue
				}
				if b, err := base64.StdEncoding.DecodeString(img.data); err == nil {
					content = append(content, &mcp.ImageContent{Data: b, MIMEType: img.mime})
				}
			}
			if m.SVG != "" {
				content = append(content, &mcp.ImageContent{Data: []byte(m.SVG), MIMEType: "image/svg+xml"})
			}
		case "error":
			failed = &m
		case "end_of_execution":
			ended = true
		}
	}
	stderr.Write(res.Stderr)
	var head []mcp.Content
	if s, _ := truncate([]byte(stdout.String()), MaxOutput, uri); strings.TrimSpace(s) != "" {
		head = append(head, &mcp.TextContent{Text: "stdout:\n" + s})
	}
	if s, _ := truncate([]byte(stderr.String()), MaxOutput, uri); strings.TrimSpace(s) != "" {
		head = append(head, &mcp.TextContent{Text: "stderr:\n" + s})
	}
	r := &mcp.CallToolResult{Content: append(head, content...)}
	switch {
	case failed != nil:
		r.IsError = true
		r.Content = append(r.Content, &mcp.TextContent{Text: fmt.Sprintf("%s: %s\n%s", failed.Name, failed.Value, failed.Traceback)})
	case !ended:
		r.IsError = true
		why := fmt.Sprintf("exit code %d", res.ExitCode)
		if res.Error != "" {
			why = res.Error
		} else if res.Signal != "" {
			why = res.Signal
		}
		r.Content = append(r.Content, &mcp.TextContent{Text: "the code interpreter stopped before the code finished (" + why + ")"})
	}
	if len(r.Content) == 0 {
		r.Content = []mcp.Content{&mcp.TextContent{Text: "(no output)"}}
	}
	return r
}
