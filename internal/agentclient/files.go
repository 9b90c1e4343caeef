package agentclient

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// ReadFile streams a file's content; size is -1 when unknown. Errors:
// ErrNotFound, ErrInvalidArgument (a directory, a bad path).
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: agentproto.PathFiles, query: url.Values{"path": {path}}})
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// WriteFile replaces path with r's content atomically, creating parent
// directories. mode 0 keeps an existing file's mode (0644 for new files);
// user ("" = the agent's default user) owns what is created.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode os.FileMode, user string) (agentproto.FileInfo, error) {
	return c.writeFile(ctx, path, r, mode, user, false)
}

// WriteFileNoFollow is WriteFile without following a symbolic link in any
// component of path (agent protocol 4): a restore writes what the
// sandbox's own code shaped, as root, into a tree it can change.
func (c *Client) WriteFileNoFollow(ctx context.Context, path string, r io.Reader, mode os.FileMode, user string) (agentproto.FileInfo, error) {
	return c.writeFile(ctx, path, r, mode, user, true)
}

func (c *Client) writeFile(ctx context.Context, path string, r io.Reader, mode os.FileMode, user string, nofollow bool) (agentproto.FileInfo, error) {
	q := url.Values{"path": {path}}
	if nofollow {
		q.Set("nofollow", "1")
	}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(unixMode(mode)), 8))
	}
	if user != "" {
		q.Set("user", user)
	}
	if r == nil {
		r = http.NoBody
	}
	var info agentproto.FileInfo
	err := c.call(ctx, request{method: http.MethodPut, path: agentproto.PathFiles, query: q, body: r}, &info)
	return info, err
}

// unixMode converts Go mode bits to the numeric form (setuid 04000…).
func unixMode(m os.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}

// Stat describes path (symlinks are not followed). Errors: ErrNotFound.
func (c *Client) Stat(ctx context.Context, path string) (agentproto.FileInfo, error) {
	var info agentproto.FileInfo
	err := c.call(ctx, request{method: http.MethodGet, path: agentproto.PathFilesStat, query: url.Values{"path": {path}}}, &info)
	return info, err
}

// List lists a directory depth levels deep (1: direct children; at most
// 10 levels and 10,000 entries). Errors: ErrNotFound, ErrInvalidArgument
// (not a directory).
func (c *Client) List(ctx context.Context, path string, depth int) ([]agentproto.FileInfo, error) {
	q := url.Values{"path": {path}, "depth": {strconv.Itoa(depth)}}
	return callList[agentproto.FileInfo](ctx, c, request{method: http.MethodGet, path: agentproto.PathFilesList, query: q}, MaxListEntries)
}

// Mkdir creates a directory and its parents. Errors: ErrConflict when a
// non-directory is in the way.
func (c *Client) Mkdir(ctx context.Context, path, user string) (agentproto.FileInfo, error) {
	return c.mkdir(ctx, path, user, false)
}

// MkdirNoFollow is Mkdir without following a symbolic link (protocol 4).
func (c *Client) MkdirNoFollow(ctx context.Context, path, user string) (agentproto.FileInfo, error) {
	return c.mkdir(ctx, path, user, true)
}

func (c *Client) mkdir(ctx context.Context, path, user string, nofollow bool) (agentproto.FileInfo, error) {
	q := url.Values{"path": {path}}
	if nofollow {
		q.Set("nofollow", "1")
	}
	if user != "" {
		q.Set("user", user)
	}
	var info agentproto.FileInfo
	err := c.call(ctx, request{method: http.MethodPost, path: agentproto.PathFilesMkdir, query: q}, &info)
	return info, err
}

// Symlink makes path a symbolic link to target owned by user, replacing
// what is there (not a directory), without following a link in path's
// directories (protocol 4).
func (c *Client) Symlink(ctx context.Context, path, target, user string) (agentproto.FileInfo, error) {
	q := url.Values{"path": {path}, "target": {target}}
	if user != "" {
		q.Set("user", user)
	}
	var info agentproto.FileInfo
	err := c.call(ctx, request{method: http.MethodPost, path: agentproto.PathFilesSymlink, query: q}, &info)
	return info, err
}

// Move renames from to to, creating to's parents. Errors: ErrNotFound.
func (c *Client) Move(ctx context.Context, from, to, user string) (agentproto.FileInfo, error) {
	var info agentproto.FileInfo
	err := c.call(ctx, request{method: http.MethodPost, path: agentproto.PathFilesMove, json: agentproto.MoveRequest{From: from, To: to, User: user}}, &info)
	return info, err
}

// Remove deletes a file, or a directory tree with recursive. Errors:
// ErrNotFound, ErrConflict (a non-empty directory without recursive).
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	return c.remove(ctx, path, recursive, false)
}

// RemoveNoFollow removes path (with recursive, a directory's tree) without
// following a symbolic link in path's directories, at path or in the tree
// (protocol 8).
func (c *Client) RemoveNoFollow(ctx context.Context, path string, recursive bool) error {
	return c.remove(ctx, path, recursive, true)
}

func (c *Client) remove(ctx context.Context, path string, recursive, nofollow bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	if nofollow {
		q.Set("nofollow", "1")
	}
	return c.call(ctx, request{method: http.MethodDelete, path: agentproto.PathFiles, query: q}, nil)
}

// Watch streams changes under a directory; the watch is in place when
// Watch returns. Errors: ErrNotFound, ErrInvalidArgument (not a directory).
func (c *Client) Watch(ctx context.Context, path string, recursive bool) (*WatchStream, error) {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: agentproto.PathFilesWatch, query: q})
	if err != nil {
		return nil, err
	}
	return &WatchStream{ctx: ctx, body: resp.Body, lines: bufio.NewReaderSize(resp.Body, 16<<10)}, nil
}

// WatchStream is an open watch; Close it to stop watching.
type WatchStream struct {
	ctx    context.Context
	body   io.ReadCloser
	lines  *bufio.Reader // NDJSON, lines of at most MaxWatchEvent
	once   sync.Once
	closed atomic.Bool
}

// Next returns the next change. It fails with ErrUnavailable when the
// session broke (watch again) and io.EOF after Close.
func (s *WatchStream) Next() (agentproto.WatchEvent, error) {
	var ev agentproto.WatchEvent
	if err := decodeLine(s.lines, MaxWatchEvent, "a watch stream", &ev); err != nil {
		if s.closed.Load() {
			return ev, io.EOF
		}
		if errors.Is(err, errdefs.ErrTooLarge) {
			return ev, err
		}
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return ev, transportError(s.ctx, err)
	}
	return ev, nil
}

// Close stops the watch.
func (s *WatchStream) Close() error {
	s.closed.Store(true)
	s.once.Do(func() { s.body.Close() })
	return nil
}
