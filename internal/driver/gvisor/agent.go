package gvisor

// A sandbox runs its agent from a copy of its own: <state>/space-agent, a
// hard link to an immutable file in the driver's agent store
// (<AgentStore>/<sha256>, copied once per agent version). The sentry maps
// the agent's code from that file for as long as the sandbox lives and
// again at every restore of its checkpoints, so it must never change: not
// when the server's agent binary is rebuilt or upgraded (by rename or in
// place), not when a checkpoint made under an older agent is restored by a
// newer server (image.go).
//
// A store entry nobody links to any more (its sandboxes are gone) is
// removed when the driver starts.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/spacesandbox/space/internal/digest"
)

// agentStore is the driver's store of agent binaries by SHA-256.
type agentStore struct {
	mu  sync.Mutex
	dir string
	// The source last hashed, to hash the server's agent once per version.
	src string
	key fileKey
	sum string
}

// fileKey changes whenever a file is replaced or written.
type fileKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

func keyOf(fi os.FileInfo) fileKey {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileKey{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	}
	return fileKey{dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// agentPath is the instance's pinned agent binary.
func (i *Instance) agentPath() string { return filepath.Join(i.stateDir, "space-agent") }

// agentSHA256 is the digest of the instance's pinned agent: known since
// its launch, hashed for an instance recovered by a restarted server.
func (i *Instance) agentSHA256() (string, error) {
	i.mu.Lock()
	sum := i.agentSum
	i.mu.Unlock()
	if sum != "" {
		return sum, nil
	}
	sum, err := digest.File(i.agentPath())
	if err != nil {
		return "", fmt.Errorf("gvisor: agent digest: %w", err)
	}
	i.mu.Lock()
	i.agentSum = sum
	i.mu.Unlock()
	return sum, nil
}

// pinAgent gives instance i its own agent binary with src's content. want
// is src's digest when the caller knows it (a checkpoint image's agent,
// checked against it when it enters the store); "" hashes src.
func (d *Driver) pinAgent(i *Instance, src, want string) error {
	s := &d.agents
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := want
	if sum == "" {
		fi, err := os.Stat(src)
		if err != nil {
			return fmt.Errorf("gvisor: agent binary: %w", err)
		}
		if k := keyOf(fi); s.src == src && s.key == k {
			sum = s.sum
		} else {
			if sum, err = digest.File(src); err != nil {
				return fmt.Errorf("gvisor: agent binary: %w", err)
			}
			s.src, s.key, s.sum = src, k, sum
		}
	}
	stored := filepath.Join(s.dir, sum)
	if _, err := os.Stat(stored); err != nil {
		if err := s.install(src, stored, sum); err != nil {
			return err
		}
	}
	if err := linkOrCopy(stored, i.agentPath()); err != nil {
		return fmt.Errorf("gvisor: pin agent: %w", err)
	}
	i.mu.Lock()
	i.agentSum = sum
	i.mu.Unlock()
	return nil
}

// install copies src into the store as stored, refusing it unless its
// content has digest sum (it changed under us, or an image's copy is not
// what the image says).
func (s *agentStore) install(src, stored, sum string) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("gvisor: agent store: %w", err)
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("gvisor: agent binary: %w", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(s.dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("gvisor: agent store: %w", err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), in); err != nil {
		tmp.Close()
		return fmt.Errorf("gvisor: agent store: %w", err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("gvisor: agent binary %s has sha256 %.12s…, want %.12s…", src, got, sum)
	}
	return os.Rename(tmp.Name(), stored)
}

// gc removes the store's binaries no sandbox links to.
func (s *agentStore) gc() {
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		p := filepath.Join(s.dir, e.Name())
		if strings.HasPrefix(e.Name(), ".tmp-") {
			os.Remove(p)
			continue
		}
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink == 1 {
			os.Remove(p)
		}
	}
}

// linkOrCopy makes dst a hard link to src, or a copy where a link cannot
// be made (another filesystem).
func linkOrCopy(src, dst string) error {
	_ = os.Remove(dst)
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}
