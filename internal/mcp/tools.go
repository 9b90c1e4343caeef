package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	space "github.com/spacesandbox/space/sdk/go"
)

// MaxOutput is how much of each of a command's streams (stdout, stderr) a
// command_run result carries: the first and last MaxOutput/2 bytes, with a
// marker naming the resource that holds the whole output between them.
const MaxOutput = 16 << 10

// MaxFileRead is the most file_read returns; a bigger file is cut with a
// marker naming its resource.
const MaxFileRead = 1 << 20

// Bounds on tool arguments (the API checks its own too).
const (
	maxCommandTimeout = 3600
	defaultCmdTimeout = 60
	maxFork           = 16
)

type createIn struct {
	Template string            `json:"template,omitempty" jsonschema:"template name (default: the server's default template)"`
	TimeoutS int               `json:"timeout_s,omitempty" jsonschema:"seconds until the sandbox is killed (default: the server's)"`
	Allow    []string          `json:"network_allow,omitempty" jsonschema:"egress allowlist: host names, *.wildcards with optional :port, CIDRs, or * for the public internet; empty: no network"`
	Deny     []string          `json:"network_deny,omitempty" jsonschema:"egress denylist (wins over the allowlist)"`
	Env      map[string]string `json:"env,omitempty" jsonschema:"environment of every process"`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"free-form labels"`
}

type idIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id (sb-…)"`
}

type listIn struct {
	State []string `json:"state,omitempty" jsonschema:"only sandboxes in these states (running, paused, stopped, …)"`
	Limit int      `json:"limit,omitempty" jsonschema:"at most this many (default 100)"`
}

type commandIn struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"the sandbox id"`
	Command   string            `json:"command" jsonschema:"shell command line, run with bash -lc"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory (absolute)"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables added for this command"`
	TimeoutS  int               `json:"timeout_s,omitempty" jsonschema:"kill the command after this many seconds (default 60, at most 3600)"`
}

type codeIn struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"the sandbox id"`
	Code      string            `json:"code" jsonschema:"the code to run"`
	Language  string            `json:"language,omitempty" jsonschema:"python (default), javascript or bash"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables for this run"`
	TimeoutS  int               `json:"timeout_s,omitempty" jsonschema:"stop after this many seconds (default 60, at most 3600)"`
}

type fileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id"`
	Path      string `json:"path" jsonschema:"absolute path in the sandbox"`
}

type writeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id"`
	Path      string `json:"path" jsonschema:"absolute path in the sandbox; parent directories are created"`
	Content   string `json:"content" jsonschema:"the file's content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (default) or base64 (content is base64 of the bytes)"`
}

type listFilesIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id"`
	Path      string `json:"path" jsonschema:"absolute directory path in the sandbox"`
	Depth     int    `json:"depth,omitempty" jsonschema:"levels to descend (default 1)"`
}

type snapshotIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox id"`
	Name      string `json:"name,omitempty" jsonschema:"a name for the snapshot (lowercase letters, digits, . _ -)"`
	Kind      string `json:"kind,omitempty" jsonschema:"checkpoint (memory and files, forkable; default) or files (the filesystem only)"`
}

type restoreIn struct {
	SandboxID  string   `json:"sandbox_id" jsonschema:"the sandbox to restore files into"`
	SnapshotID string   `json:"snapshot_id" jsonschema:"the snapshot to take them from"`
	Paths      []string `json:"paths" jsonschema:"absolute paths (files or directories) to restore"`
}

type forkIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to fork"`
	Count     int    `json:"count,omitempty" jsonschema:"children to start (default 1, at most 16)"`
	Snapshot  string `json:"snapshot_id,omitempty" jsonschema:"fork from this checkpoint instead of the running state"`
}

func (t *tools) register(s *mcp.Server) {
	destructive := true
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_create", Description: "Create and start a sandbox; returns it (its id is what the other tools take)."}, t.create)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_list", Description: "List this team's sandboxes.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.list)
	mcp.AddTool(s, &mcp.Tool{Name: "command_run", Description: fmt.Sprintf("Run a shell command in a sandbox and wait for it. Each of stdout and stderr is cut to its first and last %d bytes with a marker; the whole output is the resource named in output_uri.", MaxOutput/2)}, t.command)
	mcp.AddTool(s, &mcp.Tool{Name: "code_run", Description: "Run code in the sandbox's code interpreter (a fresh python, javascript or bash kernel per call); returns its output, results, and charts as images."}, t.code)
	mcp.AddTool(s, &mcp.Tool{Name: "file_read", Description: fmt.Sprintf("Read a file from a sandbox (text, or base64 for binary files; at most %d bytes, the rest is in its resource).", MaxFileRead), Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.fileRead)
	mcp.AddTool(s, &mcp.Tool{Name: "file_write", Description: "Write a file in a sandbox (replacing it)."}, t.fileWrite)
	mcp.AddTool(s, &mcp.Tool{Name: "file_list", Description: "List a directory of a sandbox.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.fileList)
	mcp.AddTool(s, &mcp.Tool{Name: "snapshot_create", Description: "Snapshot a sandbox; returns the snapshot (its id is what file_restore and sandbox_fork take)."}, t.snapshot)
	mcp.AddTool(s, &mcp.Tool{Name: "file_restore", Description: "Restore files or directories of a sandbox from one of its snapshots.", Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive}}, t.restore)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_fork", Description: "Fork a running sandbox into new ones with the same memory and files."}, t.fork)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_kill", Description: "Kill a sandbox.", Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive}}, t.kill)
}

func needID(id string) error {
	if strings.TrimSpace(id) == "" {
		return errors.New("sandbox_id is required")
	}
	return nil
}

func needPath(name, p string) error {
	if p == "" {
		return fmt.Errorf("%s is required", name)
	}
	if !path.IsAbs(p) {
		return fmt.Errorf("%s %q must be absolute (start with /)", name, p)
	}
	return nil
}

func cmdTimeout(s int) (int, error) {
	switch {
	case s < 0 || s > maxCommandTimeout:
		return 0, fmt.Errorf("timeout_s %d is out of range (1..%d)", s, maxCommandTimeout)
	case s == 0:
		return defaultCmdTimeout, nil
	}
	return s, nil
}

func (t *tools) create(ctx context.Context, req *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, any, error) {
	if in.TimeoutS < 0 {
		return nil, nil, fmt.Errorf("timeout_s %d must not be negative", in.TimeoutS)
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	r := space.CreateSandboxRequest{Template: in.Template, TimeoutS: in.TimeoutS, Env: in.Env, Metadata: in.Metadata}
	if len(in.Allow) > 0 || len(in.Deny) > 0 {
		r.Network = &space.NetworkPolicy{Allow: in.Allow, Deny: in.Deny}
	}
	sb, err := c.CreateSandbox(ctx, r)
	if err != nil {
		return nil, nil, apiErr("create sandbox", err)
	}
	return jsonText(sb)
}

func (t *tools) list(ctx context.Context, req *mcp.CallToolRequest, in listIn) (*mcp.CallToolResult, any, error) {
	if in.Limit < 0 || in.Limit > 1000 {
		return nil, nil, fmt.Errorf("limit %d is out of range (1..1000)", in.Limit)
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	opts := space.ListOptions{Limit: in.Limit}
	for _, s := range in.State {
		opts.State = append(opts.State, space.State(s))
	}
	l, err := c.ListSandboxes(ctx, opts)
	if err != nil {
		return nil, nil, apiErr("list sandboxes", err)
	}
	if l.Sandboxes == nil {
		l.Sandboxes = []space.Sandbox{}
	}
	return jsonText(l)
}

// commandOut is command_run's result.
type commandOut struct {
	PID       int    `json:"pid"`
	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal,omitempty"`
	Error     string `json:"error,omitempty"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
	OutputURI string `json:"output_uri"`
}

func (t *tools) command(ctx context.Context, req *mcp.CallToolRequest, in commandIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, nil, errors.New("command is required")
	}
	if in.Cwd != "" {
		if err := needPath("cwd", in.Cwd); err != nil {
			return nil, nil, err
		}
	}
	timeout, err := cmdTimeout(in.TimeoutS)
	if err != nil {
		return nil, nil, err
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	res, err := c.Exec(ctx, in.SandboxID, space.ExecRequest{Shell: in.Command, Cwd: in.Cwd, Env: in.Env, TimeoutS: timeout})
	if err != nil {
		return nil, nil, apiErr("run command", err)
	}
	uri := commandURI(in.SandboxID, res.PID)
	out := commandOut{PID: res.PID, ExitCode: res.ExitCode, Signal: res.Signal, Error: res.Error, OutputURI: uri, Truncated: res.Truncated}
	var cut bool
	out.Stdout, cut = truncate(res.Stdout, MaxOutput, uri)
	out.Truncated = out.Truncated || cut
	out.Stderr, cut = truncate(res.Stderr, MaxOutput, uri)
	out.Truncated = out.Truncated || cut
	r, _, err := jsonText(out)
	if err != nil {
		return nil, nil, err
	}
	return r, nil, nil
}

// truncate returns b as text, cut to its first and last max/2 bytes (on
// rune boundaries) around a marker that names the whole output's uri.
func truncate(b []byte, max int, uri string) (string, bool) {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	if len(s) <= max {
		return s, false
	}
	head, tail := max/2, len(s)-max/2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	for tail < len(s) && !utf8.RuneStart(s[tail]) {
		tail++
	}
	return s[:head] + fmt.Sprintf("\n[... %d bytes truncated; full output: %s ...]\n", tail-head, uri) + s[tail:], true
}

func (t *tools) fileRead(ctx context.Context, req *mcp.CallToolRequest, in fileIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	if err := needPath("path", in.Path); err != nil {
		return nil, nil, err
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	rc, err := c.ReadFile(ctx, in.SandboxID, in.Path)
	if err != nil {
		return nil, nil, apiErr("read "+in.Path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxFileRead+1))
	if err != nil {
		return nil, nil, apiErr("read "+in.Path, err)
	}
	uri := fileURI(in.SandboxID, in.Path)
	more := len(b) > MaxFileRead
	if more {
		b = b[:MaxFileRead]
	}
	var content []mcp.Content
	if utf8.Valid(b) || (more && utf8.Valid(b[:max(0, len(b)-3)])) {
		content = append(content, &mcp.TextContent{Text: string(bytes.ToValidUTF8(b, nil))})
	} else {
		content = append(content, &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: uri, MIMEType: "application/octet-stream", Blob: b}})
	}
	if more {
		content = append(content, &mcp.TextContent{Text: fmt.Sprintf("[... file truncated at %d bytes; whole file: %s ...]", MaxFileRead, uri)})
	}
	return &mcp.CallToolResult{Content: content}, nil, nil
}

func (t *tools) fileWrite(ctx context.Context, req *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	if err := needPath("path", in.Path); err != nil {
		return nil, nil, err
	}
	data := []byte(in.Content)
	switch strings.ToLower(in.Encoding) {
	case "", "utf-8", "utf8", "text":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, nil, fmt.Errorf("content is not valid base64: %v", err)
		}
	default:
		return nil, nil, fmt.Errorf("encoding %q is not supported (utf-8, base64)", in.Encoding)
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	fi, err := c.WriteFile(ctx, in.SandboxID, in.Path, bytes.NewReader(data))
	if err != nil {
		return nil, nil, apiErr("write "+in.Path, err)
	}
	return jsonText(fi)
}

func (t *tools) fileList(ctx context.Context, req *mcp.CallToolRequest, in listFilesIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	if err := needPath("path", in.Path); err != nil {
		return nil, nil, err
	}
	if in.Depth < 0 || in.Depth > 10 {
		return nil, nil, fmt.Errorf("depth %d is out of range (1..10)", in.Depth)
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	fs, err := c.ListFiles(ctx, in.SandboxID, in.Path, max(in.Depth, 1))
	if err != nil {
		return nil, nil, apiErr("list "+in.Path, err)
	}
	if fs == nil {
		fs = []space.FileInfo{}
	}
	return jsonText(fs)
}

func (t *tools) snapshot(ctx context.Context, req *mcp.CallToolRequest, in snapshotIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	switch in.Kind {
	case "", "checkpoint", "files":
	default:
		return nil, nil, fmt.Errorf("kind %q is not supported (checkpoint, files)", in.Kind)
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	sn, err := c.CreateSnapshot(ctx, in.SandboxID, space.SnapshotRequest{Kind: in.Kind, Name: in.Name})
	if err != nil {
		return nil, nil, apiErr("snapshot", err)
	}
	return jsonText(sn)
}

func (t *tools) restore(ctx context.Context, req *mcp.CallToolRequest, in restoreIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	if strings.TrimSpace(in.SnapshotID) == "" {
		return nil, nil, errors.New("snapshot_id is required")
	}
	if len(in.Paths) == 0 {
		return nil, nil, errors.New("paths: give at least one path to restore")
	}
	for _, p := range in.Paths {
		if err := needPath("paths", p); err != nil {
			return nil, nil, err
		}
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	r, err := c.RestoreFiles(ctx, in.SandboxID, in.SnapshotID, in.Paths)
	if err != nil {
		return nil, nil, apiErr("restore", err)
	}
	return jsonText(r)
}

func (t *tools) fork(ctx context.Context, req *mcp.CallToolRequest, in forkIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	if in.Count < 0 || in.Count > maxFork {
		return nil, nil, fmt.Errorf("count %d is out of range (1..%d)", in.Count, maxFork)
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	sbs, err := c.Fork(ctx, in.SandboxID, space.ForkRequest{Count: in.Count, Snapshot: in.Snapshot})
	if err != nil {
		return nil, nil, apiErr("fork", err)
	}
	return jsonText(map[string]any{"sandboxes": sbs})
}

func (t *tools) kill(ctx context.Context, req *mcp.CallToolRequest, in idIn) (*mcp.CallToolResult, any, error) {
	if err := needID(in.SandboxID); err != nil {
		return nil, nil, err
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	if err := c.KillSandbox(ctx, in.SandboxID); err != nil {
		return nil, nil, apiErr("kill", err)
	}
	return jsonText(map[string]any{"sandbox_id": in.SandboxID, "killed": true})
}
