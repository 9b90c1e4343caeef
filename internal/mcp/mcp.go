// Package mcp serves space as a Model Context Protocol server: tools to
// create sandboxes, run commands and code, read and write files, snapshot,
// restore, fork and kill, and resources for a sandbox's files and command
// output. It is built on the official Go SDK.
//
// The tools hold no lifecycle logic: each one is a call of the public /v1
// API through the Go client (sdk/go), with the caller's API key. `space
// serve` answers /mcp (streamable HTTP) by running those calls in process
// against its own /v1 handler (Handler), so authentication, team
// isolation, validation, rate limits and rollbacks are the API's own;
// `space mcp` runs the same server over stdio against a remote server URL.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	space "github.com/spacesandbox/space/sdk/go"
)

// Backend returns the API client a request runs with: the one the caller's
// credentials give (extra carries the HTTP request's headers on /mcp; nil
// over stdio).
type Backend func(ctx context.Context, extra *mcp.RequestExtra) (*space.Client, error)

// New returns the MCP server whose tools and resources call the API
// through b.
func New(b Backend, version string) *mcp.Server {
	if version == "" {
		version = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "space", Title: "space sandboxes", Version: version}, &mcp.ServerOptions{
		Instructions: "space runs untrusted code in isolated sandboxes. Create a sandbox with sandbox_create, " +
			"then run commands (command_run) or code (code_run) and move files (file_read, file_write, file_list). " +
			"Kill sandboxes you no longer need with sandbox_kill.",
	})
	t := &tools{backend: b}
	t.register(s)
	t.registerResources(s)
	return s
}

type tools struct {
	backend Backend
}

func (t *tools) client(ctx context.Context, req interface{ GetExtra() *mcp.RequestExtra }) (*space.Client, error) {
	var extra *mcp.RequestExtra
	if req != nil {
		extra = req.GetExtra()
	}
	c, err := t.backend(ctx, extra)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, errors.New("no API client")
	}
	return c, nil
}

// jsonText is a tool result whose text is v as JSON (and v its
// structured content).
func jsonText(v any) (*mcp.CallToolResult, any, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("encode result: %w", err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, nil, nil
}

// apiErr gives an API error the operation it failed in; the API's message
// is meant for people and is kept as is.
func apiErr(op string, err error) error {
	var ae *space.APIError
	if errors.As(err, &ae) {
		return fmt.Errorf("%s: %s (%s)", op, ae.Error(), ae.Code)
	}
	return fmt.Errorf("%s: %w", op, err)
}
