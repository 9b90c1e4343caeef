package vmimage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

var digestRE = regexp.MustCompile(`^[0-9a-zA-Z_-]{8,128}$`)

// rootImageFormat is in every root image's cache name and changes when
// the way an image is made from a rootfs does, so a new layout never
// reuses an old entry (as initramfsFormat for the initramfs).
const rootImageFormat = "r1"

// checkRootImage tells a usable cached root image: an ext4 superblock
// magic (0xEF53 at 1080) in a file of an image's size.
func checkRootImage(path string) error {
	return checkFile(path, 1<<20, 1024+0x38, []byte{0x53, 0xef})
}

// RootImage returns a raw ext4 image of the template root filesystem
// rootfsDir, cached as <cacheDir>/root/<digest>.<format>.ext4 (digest is
// the template's digest, format rootImageFormat). VMs use it read-only,
// as the shared backing file of a per-sandbox qcow2 overlay. The image is
// sparse and sized with room to grow (the guest's writes fill the free
// space through the overlay). Errors: errdefs.ErrUnavailable when
// mkfs.ext4 is missing (apt-get install e2fsprogs),
// errdefs.ErrInvalidArgument for a bad digest or dir.
func RootImage(ctx context.Context, cacheDir, rootfsDir, digest string) (string, error) {
	if !digestRE.MatchString(digest) {
		return "", errdefs.InvalidArgument("vmimage: bad template digest %q", digest)
	}
	if fi, err := os.Stat(filepath.Join(rootfsDir, "bin")); err != nil || !fi.IsDir() {
		return "", errdefs.InvalidArgument("vmimage: %s is not a root filesystem", rootfsDir)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return "", errdefs.Unavailable("vmimage: mkfs.ext4 not found: apt-get install -y e2fsprogs")
	}
	return cached(ctx, filepath.Join(cacheDir, "root"), digest+"."+rootImageFormat+".ext4", checkRootImage, func(tmp string) error {
		used, files, err := usage(rootfsDir)
		if err != nil {
			return err
		}
		// Room for the guest's writes: the image is sparse, so free space
		// costs nothing on the host until written.
		size := used*2 + 2<<30
		size = (size + 1<<20 - 1) &^ (1<<20 - 1)
		inodes := files*2 + 65536
		cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4",
			"-L", "space-root", "-N", fmt.Sprint(inodes),
			"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
			"-d", rootfsDir, tmp, fmt.Sprintf("%dM", size>>20))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("vmimage: mkfs.ext4 -d %s: %v: %s", rootfsDir, err, strings.TrimSpace(out.String()))
		}
		return nil
	})
}

// usage returns the apparent size of the files below dir and their count.
func usage(dir string) (int64, int64, error) {
	var total, n int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n++
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		} else {
			total += info.Size()
		}
		return nil
	})
	return total, n, err
}

// RootImageDigests lists the template digests that have a root image in
// the cache (any format), with the newest modification time of each.
func RootImageDigests(cacheDir string) (map[string]time.Time, error) {
	entries, err := os.ReadDir(filepath.Join(cacheDir, "root"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vmimage cache: %w", err)
	}
	out := map[string]time.Time{}
	for _, e := range entries {
		d, _, _ := strings.Cut(e.Name(), ".")
		if !digestRE.MatchString(d) || !strings.HasSuffix(e.Name(), ".ext4") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if t, ok := out[d]; !ok || fi.ModTime().After(t) {
			out[d] = fi.ModTime()
		}
	}
	return out, nil
}

// RemoveRootImages removes the root images of digest (every format),
// each under its lock, tried once: false when a build holds one. A VM
// using an image keeps its open file; the caller removes only digests no
// sandbox or snapshot needs.
func RemoveRootImages(cacheDir, digest string) (bool, error) {
	if !digestRE.MatchString(digest) {
		return false, errdefs.InvalidArgument("vmimage: bad template digest %q", digest)
	}
	paths, _ := filepath.Glob(filepath.Join(cacheDir, "root", digest+"*.ext4"))
	for _, p := range paths {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		unlock, err := lockFile(ctx, p+".lock")
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		err = os.Remove(p)
		unlock()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("vmimage cache: %w", err)
		}
	}
	return true, nil
}
