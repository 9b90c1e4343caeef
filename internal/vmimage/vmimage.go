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
	"context"
	"errors"
	"fmt"
	"github.com/spacesandbox/space/internal/filelock"
	"io/fs"
	"os"
	"path/filepath"
)

// cached returns <dir>/<name>, building it with build(tmpPath) unless it
// exists. build writes tmpPath; it is renamed to the final name on success.
func cached(ctx context.Context, dir, name string, build func(tmp string) error) (string, error) {
	final := filepath.Join(dir, name)
	if _, err := os.Stat(final); err == nil {
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
	if _, err := os.Stat(final); err == nil {
		return final, nil // built by another process while we waited
	}
	tmp := fmt.Sprintf("%s.tmp-%d", final, os.Getpid())
	_ = os.RemoveAll(tmp)
	if err := build(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("vmimage cache: %w", err)
	}
	return final, nil
}

// lockFile takes the cache's cross-process build lock on path.
func lockFile(ctx context.Context, path string) (func(), error) {
	return filelock.Lock(ctx, path)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, fs.ErrNotExist)
}
