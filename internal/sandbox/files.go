package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"path"
	"regexp"
	"strings"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// homeDir is where relative paths resolve inside a sandbox.
const homeDir = "/home/user"

// cleanPath validates a sandbox path: absolute (or relative to the user's
// home), no NUL, no ".." segment (refused rather than resolved, so a caller
// never gets a different file than it named), at most 4096 bytes.
func cleanPath(p string) (string, error) {
	if p == "" {
		return "", errdefs.InvalidArgument("path: required")
	}
	if len(p) > 4096 || containsNUL(p) {
		return "", errdefs.InvalidArgument("path: too long or contains NUL")
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return "", errdefs.InvalidArgument("path: %q contains a '..' segment", p)
		}
	}
	if !strings.HasPrefix(p, "/") {
		p = homeDir + "/" + p
	}
	return path.Clean(p), nil
}

// ReadFile streams a file out of the sandbox.
func (s *Service) ReadFile(ctx context.Context, c Caller, id, p string) (io.ReadCloser, int64, error) {
	p, err := cleanPath(p)
	if err != nil {
		return nil, 0, err
	}
	a, err := s.agentFor(ctx, c, id)
	if err != nil {
		return nil, 0, err
	}
	return a.ReadFile(ctx, p)
}

// WriteFile streams r into a file in the sandbox (parents created).
func (s *Service) WriteFile(ctx context.Context, c Caller, id, p string, r io.Reader) (agentproto.FileInfo, error) {
	return s.WriteFileAs(ctx, c, id, p, "", r)
}

// WriteFileAs is WriteFile owned by user (the sandbox's default user when
// empty): the file, and the directories it creates.
func (s *Service) WriteFileAs(ctx context.Context, c Caller, id, p, user string, r io.Reader) (agentproto.FileInfo, error) {
	fi, _, err := s.writeFile(ctx, c, id, p, user, r, "", false)
	return fi, err
}

// WriteFileChecked is WriteFileAs that also returns the SHA-256 (hex) of
// the bytes written and, when want is set, writes nothing unless they
// have that SHA-256: the agent renames its temporary file into place only
// at the end of the body, and a mismatch cuts the body short instead of
// ending it (as a broken connection would).
func (s *Service) WriteFileChecked(ctx context.Context, c Caller, id, p, user string, r io.Reader, want string) (agentproto.FileInfo, string, error) {
	return s.writeFile(ctx, c, id, p, user, r, want, true)
}

// writeFile is WriteFileChecked; the body is hashed only when a SHA-256 is
// wanted back or given.
func (s *Service) writeFile(ctx context.Context, c Caller, id, p, user string, r io.Reader, want string, sum bool) (agentproto.FileInfo, string, error) {
	if want != "" && !sha256RE.MatchString(want) {
		return agentproto.FileInfo{}, "", errdefs.InvalidArgument("sha256: 64 hexadecimal digits, the SHA-256 of the body")
	}
	if err := validUser(user); err != nil {
		return agentproto.FileInfo{}, "", err
	}
	if strings.HasSuffix(p, "/") {
		return agentproto.FileInfo{}, "", errdefs.InvalidArgument("path: %q ends in '/': name the file to write", p)
	}
	p, err := cleanPath(p)
	if err != nil {
		return agentproto.FileInfo{}, "", err
	}
	a, err := s.agentFor(ctx, c, id)
	if err != nil {
		return agentproto.FileInfo{}, "", err
	}
	br := &bodyReader{r: r, want: strings.ToLower(want)}
	if sum || want != "" {
		br.h = sha256.New()
	}
	fi, err := a.WriteFile(ctx, p, br, 0, user)
	if err != nil && br.err != nil {
		return fi, "", errdefs.InvalidArgument("request body: %v (the file was not written)", br.err)
	}
	if err != nil || br.h == nil {
		return fi, "", err
	}
	return fi, hex.EncodeToString(br.h.Sum(nil)), nil
}

var sha256RE = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// bodyReader keeps the error of the caller's body (a connection cut, a body
// shorter than its Content-Length): the write failed because of it, a 400,
// whatever the agent call reports (a cancelled request, mostly). It hashes
// what passes and, when want is set, turns the body's end into an error if
// the SHA-256 differs, so the agent never sees a complete body.
type bodyReader struct {
	r    io.Reader
	err  error
	h    hash.Hash // nil: not hashed
	want string
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.h != nil {
		b.h.Write(p[:n])
	}
	if err == io.EOF && b.want != "" {
		if got := hex.EncodeToString(b.h.Sum(nil)); got != b.want {
			err = fmt.Errorf("its SHA-256 is %s, not the %s asked for", got, b.want)
		}
	}
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// Stat describes one file.
func (s *Service) Stat(ctx context.Context, c Caller, id, p string) (agentproto.FileInfo, error) {
	p, err := cleanPath(p)
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	a, err := s.agentFor(ctx, c, id)
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	return a.Stat(ctx, p)
}

// ListFiles lists a directory to depth levels.
func (s *Service) ListFiles(ctx context.Context, c Caller, id, p string, depth int) ([]agentproto.FileInfo, error) {
	p, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	if depth == 0 {
		depth = 1
	}
	if depth < 0 || depth > 10 {
		return nil, errdefs.InvalidArgument("depth: must be between 1 and 10")
	}
	a, err := s.agentFor(ctx, c, id)
	if err != nil {
		return nil, err
	}
	return a.List(ctx, p, depth)
}

// Mkdir creates a directory and its parents, owned by user (the sandbox's
// default user when empty).
func (s *Service) Mkdir(ctx context.Context, c Caller, id, p, user string) (agentproto.FileInfo, error) {
	if err := validUser(user); err != nil {
		return agentproto.FileInfo{}, err
	}
	p, err := cleanPath(p)
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	a, err := s.agentFor(ctx, c, id)
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	return a.Mkdir(ctx, p, user)
}

// Move renames a file or directory.
func (s *Service) Move(ctx context.Context, c Caller, id, from, to string) (agentproto.FileInfo, error) {
	from, err := cleanPath(from)
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	to, err = cleanPath(to)
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	a, err := s.agentFor(ctx, c, id)
	if err != nil {
		return agentproto.FileInfo{}, err
	}
	return a.Move(ctx, from, to, "")
}

// Remove deletes a file, or a directory tree when recursive.
func (s *Service) Remove(ctx context.Context, c Caller, id, p string, recursive bool) error {
	p, err := cleanPath(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return errdefs.InvalidArgument("path: refusing to remove /")
	}
	a, err := s.agentFor(ctx, c, id)
	if err != nil {
		return err
	}
	return a.Remove(ctx, p, recursive)
}

// Watch streams changes under a directory.
func (s *Service) Watch(ctx context.Context, c Caller, id, p string, recursive bool) (interface {
	Next() (agentproto.WatchEvent, error)
	Close() error
}, error) {
	p, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	a, err := s.agentFor(ctx, c, id)
	if err != nil {
		return nil, err
	}
	return a.Watch(ctx, p, recursive)
}
