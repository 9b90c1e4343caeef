package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// stampSuffix names a build's "in use" stamp, "<digest>.used": its
// modification time is when a process sharing the cache last said it uses
// the build (Touch). Several servers may share one cache, each knowing
// only its own records, so a build goes (Prune) only when none of them
// touched it for a while.
const stampSuffix = ".used"

// pruneTmpPrefix names a build being removed: it is renamed first, so a
// Lookup never sees it half gone; a crash leaves one for the next Prune.
const pruneTmpPrefix = ".prune-"

// Touch records that the build of digest is in use now.
func (b *Builder) Touch(digest string) error {
	if !digestRE.MatchString(digest) {
		return errdefs.InvalidArgument("malformed template digest %q", digest)
	}
	p := filepath.Join(b.dir, digest+stampSuffix)
	now := time.Now()
	err := os.Chtimes(p, now, now)
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// Prune removes the complete builds whose digest keep does not hold and
// that nobody touched within idle of now (the stamp's time, else the
// build's), with their stamps, and the leftovers of an interrupted Prune.
// A build whose lock is held (being built) is left alone: the lock is
// tried, never waited for. It returns the digests removed.
func (b *Builder) Prune(keep func(digest string) bool, idle time.Duration, now time.Time) ([]string, error) {
	if left, _ := filepath.Glob(filepath.Join(b.dir, pruneTmpPrefix+"*")); len(left) > 0 {
		for _, d := range left {
			if err := removeTree(d); err != nil {
				return nil, err
			}
		}
	}
	list, err := b.List()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, t := range list {
		if keep(t.Digest) {
			continue
		}
		last := t.BuiltAt
		stamp := filepath.Join(b.dir, t.Digest+stampSuffix)
		if fi, err := os.Stat(stamp); err == nil {
			last = fi.ModTime()
		}
		if now.Sub(last) < idle {
			continue
		}
		if ok, err := b.remove(t.Digest); err != nil || !ok {
			if err != nil {
				errs = append(errs, err)
			}
			continue
		}
		_ = os.Remove(stamp)
		removed = append(removed, t.Digest)
	}
	return removed, errors.Join(errs...)
}

// remove deletes the build of digest under its lock, tried once: false
// when a build holds it.
func (b *Builder) remove(digest string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	unlock, err := lockFile(ctx, filepath.Join(b.dir, digest+".lock"))
	cancel()
	if errors.Is(err, context.DeadlineExceeded) {
		return false, nil // the next Prune looks again
	}
	if err != nil {
		return false, err
	}
	defer unlock()
	tmp := filepath.Join(b.dir, pruneTmpPrefix+digest)
	if err := os.Rename(filepath.Join(b.dir, digest), tmp); err != nil {
		return false, fmt.Errorf("template prune %s: %w", digest, err)
	}
	return true, removeTree(tmp)
}
