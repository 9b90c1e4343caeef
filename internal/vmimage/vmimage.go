// Package vmimage owns what VM drivers boot: the guest kernel (the
// uncompressed vmlinux extracted from Debian's linux-image-cloud-amd64), the
// initramfs (space-agent as /init plus the virtio modules it loads) and the
// template's root filesystem as a raw ext4 image.
//
// Every artifact is cached under a cache directory by the digest of its
// inputs. A build happens in a temporary file renamed into place, under an
// flock per artifact, so concurrent processes sharing the cache build once
// and never see a half-written file.
package vmimage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/spacesandbox/space/internal/filelock"
	"io/fs"
	"os"
	"path/filepath"
)

// cached returns <dir>/<name>, building it with build(tmpPath) unless a
// file that passes check is there. build writes tmpPath; it is made
// durable (file and directory fsynced) and renamed to the final name, so a
// crash or power loss leaves either no entry or a complete one. check
// (minimum size, magic numbers) still guards every hit: an entry written
// before entries were fsynced may be empty or torn, and would otherwise be
// served forever.
func cached(ctx context.Context, dir, name string, check func(path string) error, build func(tmp string) error) (string, error) {
	final := filepath.Join(dir, name)
	if check(final) == nil {
		return final, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("vmimage cache: %w", err)
	}
	unlock, err := lockFile(ctx, final+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if check(final) == nil {
		return final, nil // built by another process while we waited
	}
	// We hold the lock: a bad entry and temp files of crashed builds are
	// debris. (A VM using a bad entry keeps its open file.)
	stale, _ := filepath.Glob(final + ".tmp-*")
	for _, p := range append(stale, final) {
		if err := os.RemoveAll(p); err != nil {
			return "", fmt.Errorf("vmimage cache: %w", err)
		}
	}
	tmp := fmt.Sprintf("%s.tmp-%d", final, os.Getpid())
	if err := build(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	if err := check(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("vmimage: built %s is bad: %w", name, err)
	}
	if err := syncFile(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("vmimage cache: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("vmimage cache: %w", err)
	}
	if err := syncFile(dir); err != nil {
		return "", fmt.Errorf("vmimage cache: %w", err)
	}
	return final, nil
}

// syncFile fsyncs a file or directory.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// checkFile reports whether path is a regular file of at least minSize
// bytes holding magic at offset off.
func checkFile(path string, minSize, off int64, magic []byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Size() < minSize {
		return fmt.Errorf("%s: %d bytes, want at least %d", path, st.Size(), minSize)
	}
	got := make([]byte, len(magic))
	if _, err := f.ReadAt(got, off); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if !bytes.Equal(got, magic) {
		return fmt.Errorf("%s: bad magic % x at %d", path, got, off)
	}
	return nil
}

// lockFile takes the cache's cross-process build lock on path.
func lockFile(ctx context.Context, path string) (func(), error) {
	return filelock.Lock(ctx, path)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
