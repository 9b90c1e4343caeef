package mcp

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	space "github.com/spacesandbox/space/sdk/go"
)

// MaxResource is the most a resource read returns.
const MaxResource = 16 << 20

const uriPrefix = "space://sandboxes/"

func fileURI(id, p string) string {
	return uriPrefix + url.PathEscape(id) + "/files" + (&url.URL{Path: p}).EscapedPath()
}

func commandURI(id string, pid int) string {
	return uriPrefix + url.PathEscape(id) + "/commands/" + strconv.Itoa(pid) + "/output"
}

func (t *tools) registerResources(s *mcp.Server) {
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "sandbox-file",
		Title:       "A file in a sandbox",
		Description: "The content of a file in a sandbox, by its absolute path.",
		URITemplate: uriPrefix + "{id}/files/{+path}",
	}, t.readFileResource)
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "command-output",
		Title:       "A command's whole output",
		Description: "The whole output (stdout and stderr, in order) of a command started in a sandbox, by its pid (command_run's output_uri).",
		URITemplate: uriPrefix + "{id}/commands/{pid}/output",
		MIMEType:    "text/plain",
	}, t.readCommandResource)
}

// parseURI splits space://sandboxes/{id}/{kind}/{rest}.
func parseURI(raw, kind string) (id, rest string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "space" || u.Host != "sandboxes" {
		return "", "", mcp.ResourceNotFoundError(raw)
	}
	p := strings.TrimPrefix(u.Path, "/")
	id, rest, ok := strings.Cut(p, "/"+kind+"/")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", "", mcp.ResourceNotFoundError(raw)
	}
	return id, rest, nil
}

func (t *tools) readFileResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id, p, err := parseURI(uri, "files")
	if err != nil {
		return nil, err
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, err
	}
	rc, err := c.ReadFile(ctx, id, "/"+p)
	if err != nil {
		if space.IsNotFound(err) {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		return nil, apiErr("read /"+p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxResource+1))
	if err != nil {
		return nil, apiErr("read /"+p, err)
	}
	if len(b) > MaxResource {
		return nil, fmt.Errorf("read /%s: the file is bigger than %d bytes; copy it out with the API or the CLI (space cp)", p, MaxResource)
	}
	rcnt := &mcp.ResourceContents{URI: uri}
	if utf8.Valid(b) {
		rcnt.MIMEType, rcnt.Text = "text/plain", string(b)
	} else {
		rcnt.MIMEType, rcnt.Blob = "application/octet-stream", b
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{rcnt}}, nil
}

func (t *tools) readCommandResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	id, rest, err := parseURI(uri, "commands")
	if err != nil {
		return nil, err
	}
	pidStr, ok := strings.CutSuffix(rest, "/output")
	pid, perr := strconv.Atoi(pidStr)
	if !ok || perr != nil || pid <= 0 {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	c, err := t.client(ctx, req)
	if err != nil {
		return nil, err
	}
	evs, err := c.BufferedEvents(ctx, id, pid, -1)
	if err != nil {
		if space.IsNotFound(err) {
			return nil, mcp.ResourceNotFoundError(uri)
		}
		return nil, apiErr("command output", err)
	}
	defer evs.Close()
	var out []byte
	for {
		ev, err := evs.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, apiErr("command output", err)
		}
		switch ev.Type {
		case space.EventStdout, space.EventStderr:
			if len(out)+len(ev.Data) > MaxResource {
				return nil, fmt.Errorf("command output: more than %d bytes", MaxResource)
			}
			out = append(out, ev.Data...)
		case space.EventTruncated:
			out = append(out, "\n[... the server dropped part of this output ...]\n"...)
		}
	}
	text := strings.ToValidUTF8(string(out), "\uFFFD")
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: text}}}, nil
}
