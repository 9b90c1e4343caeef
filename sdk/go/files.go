package space

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// File types in FileInfo.Type.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"` // absolute
	Type   string    `json:"type"` // FileTypeFile, FileTypeDir, FileTypeSymlink or FileTypeOther
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits, e.g. 0o644
	Owner  string    `json:"owner,omitempty"`
	MTime  time.Time `json:"mtime"`
	Target string    `json:"target,omitempty"` // a symlink's target
	// SHA256 (hex) of the bytes an upload wrote; empty elsewhere.
	SHA256 string `json:"sha256,omitempty"`
}

// IsDir reports whether the entry is a directory.
func (f FileInfo) IsDir() bool { return f.Type == FileTypeDir }

func filesPath(id, op string) string {
	p := "/v1/sandboxes/" + seg(id) + "/files"
	if op != "" {
		p += "/" + op
	}
	return p
}

// WriteFile creates or replaces the file at path (absolute, in the sandbox)
// with the contents of r, creating parent directories. The body is streamed as
// it is read, never buffered whole; when r is an *os.File, a
// *bytes.Reader or similar the length is sent too.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader) (*FileInfo, error) {
	return c.WriteFileAs(ctx, id, path, "", r)
}

// WriteFileAs is WriteFile with the file, and the directories made for it,
// owned by user (the sandbox's default user when empty).
func (c *Client) WriteFileAs(ctx context.Context, id, path, user string, r io.Reader) (*FileInfo, error) {
	return c.WriteFileChecked(ctx, id, path, user, "", r)
}

// WriteFileChecked is WriteFileAs that, with wantSHA256 (hex) set, writes
// nothing unless the body has that SHA-256 (the server checks it before
// the file takes its place; a mismatch is IsInvalidArgument and an earlier
// file at path is left as it was). Every upload also compares the SHA-256
// the server reports with the bytes this client sent, and returns an
// error if they differ.
func (c *Client) WriteFileChecked(ctx context.Context, id, path, user, wantSHA256 string, r io.Reader) (*FileInfo, error) {
	if r == nil {
		r = http.NoBody
	}
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("user", user)
	}
	if wantSHA256 != "" {
		q.Set("sha256", wantSHA256)
	}
	h := sha256.New()
	var body io.Reader = io.TeeReader(r, h)
	if n := bodyLength(r); n >= 0 {
		body = sizedReader{body, n} // still sent with its Content-Length
	}
	var fi FileInfo
	err := c.do(ctx, request{
		method: http.MethodPut,
		path:   filesPath(id, ""),
		query:  q,
		body:   body,
		ctype:  "application/octet-stream",
	}, &fi)
	if err != nil {
		return nil, err
	}
	if sent := hex.EncodeToString(h.Sum(nil)); fi.SHA256 != "" && fi.SHA256 != sent {
		return &fi, fmt.Errorf("space: %s in sandbox %s has SHA-256 %s, but the bytes sent have %s", path, id, fi.SHA256, sent)
	}
	return &fi, nil
}

// sizedReader is a reader whose length was known before it was wrapped.
type sizedReader struct {
	io.Reader
	n int64
}

func (s sizedReader) Len() int { return int(s.n) }

// ReadFile opens the file at path for reading. The caller must close it. The
// returned reader streams from the server; errors mid-way surface from Read.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodGet,
		path:   filesPath(id, ""),
		query:  url.Values{"path": {path}},
		header: http.Header{"Accept": {"application/octet-stream"}},
	})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Remove deletes the file or empty directory at path; with recursive it
// deletes a directory and its contents.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.do(ctx, request{method: http.MethodDelete, path: filesPath(id, ""), query: q}, nil)
}

// Stat describes the file at path without following a final symlink.
func (c *Client) Stat(ctx context.Context, id, path string) (*FileInfo, error) {
	var fi FileInfo
	if err := c.do(ctx, request{method: http.MethodGet, path: filesPath(id, "stat"), query: url.Values{"path": {path}}}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// ListFiles lists the directory at path, descending depth levels (depth <= 0
// means the server's default, 1).
func (c *Client) ListFiles(ctx context.Context, id, path string, depth int) ([]FileInfo, error) {
	q := url.Values{"path": {path}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	var out struct {
		Entries []FileInfo `json:"entries"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: filesPath(id, "list"), query: q}, &out); err != nil {
		return nil, err
	}
	return out.Entries, nil
}

// Mkdir creates the directory at path and any missing parents.
func (c *Client) Mkdir(ctx context.Context, id, path string) (*FileInfo, error) {
	return c.MkdirAs(ctx, id, path, "")
}

// MkdirAs is Mkdir with the directories made owned by user (the sandbox's
// default user when empty).
func (c *Client) MkdirAs(ctx context.Context, id, path, user string) (*FileInfo, error) {
	var fi FileInfo
	body := struct {
		Path string `json:"path"`
		User string `json:"user,omitempty"`
	}{path, user}
	if err := c.do(ctx, request{method: http.MethodPost, path: filesPath(id, "mkdir"), json: body}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Move renames from to to, and describes the result.
func (c *Client) Move(ctx context.Context, id, from, to string) (*FileInfo, error) {
	var fi FileInfo
	body := struct {
		From string `json:"from"`
		To   string `json:"to"`
	}{from, to}
	if err := c.do(ctx, request{method: http.MethodPost, path: filesPath(id, "move"), json: body}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}
