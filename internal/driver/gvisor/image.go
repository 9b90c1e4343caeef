package gvisor

// Checkpoint images outlive the build that made them: a snapshot taken
// today is restored (created from, forked) after space or runsc is
// upgraded. Three things decide whether that can work.
//
// The runsc binary. gVisor saves its kernel's state in its own encoding
// and checks only its version string across a restore, and a runsc built
// from the module proxy says VERSION_MISSING whatever its version. So the
// driver stamps each image with the SHA-256 of the runsc that made it and
// refuses, with a clear error, to restore one made by another binary
// (images from before the stamp are tried as they are).
//
// The agent binary. The restored agent is the checkpointed process: its
// code pages come from the file bind-mounted at /.space/bin/space-agent,
// so the restore must mount the very binary it ran, not the server's
// current one (a new agent there crashes the restored one). Every image
// carries that binary (space-agent, a hard link where it can be: the
// snapshot store keeps one copy of it however many images hold it), and a
// sandbox runs its agent from its own pinned copy (agent.go), never from a
// path an upgrade may replace.
//
// The spec. runsc restores the mount tree it saved and refuses a restore
// spec whose mounts differ from the checkpointed ones in anything but
// their sources. When a space upgrade changes the sandbox's mounts (the
// bounded /tmp did), an image made before it must still restore: the
// restore spec takes the mounts recorded in the image (destinations, types,
// options) with this instance's sources.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/spacesandbox/space/internal/digest"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Files the driver adds to runsc's in every checkpoint image.
const (
	imageStampFile = "space-image.json"
	imageAgentFile = "space-agent"
)

type imageStamp struct {
	RunscSHA256 string `json:"runsc_sha256"`
	AgentSHA256 string `json:"agent_sha256,omitempty"` // of imageAgentFile
}

// runscDigest is the SHA-256 of the driver's runsc binary, computed once.
type runscDigest struct {
	once sync.Once
	sum  string
	err  error
}

func (d *Driver) runscSHA256() (string, error) {
	d.runscSum.once.Do(func() { d.runscSum.sum, d.runscSum.err = digest.File(d.cfg.Runsc) })
	return d.runscSum.sum, d.runscSum.err
}

// stampImage completes the checkpoint image in dir: the agent binary the
// sandbox runs and the stamp naming it and the runsc that made the image.
// A sandbox started before agents were pinned has no copy of its own: its
// image carries none and restores with the server's agent, as before.
func (i *Instance) stampImage(dir string) error {
	sum, err := i.d.runscSHA256()
	if err != nil {
		return fmt.Errorf("gvisor: runsc digest: %w", err)
	}
	st := imageStamp{RunscSHA256: sum}
	if _, err := os.Stat(i.agentPath()); err == nil {
		if st.AgentSHA256, err = i.agentSHA256(); err != nil {
			return err
		}
		if err := linkOrCopy(i.agentPath(), filepath.Join(dir, imageAgentFile)); err != nil {
			return fmt.Errorf("gvisor: agent into the checkpoint image: %w", err)
		}
	}
	if err := i.imageSecret(dir); err != nil {
		return err
	}
	b, _ := json.Marshal(st)
	return os.WriteFile(filepath.Join(dir, imageStampFile), b, 0o600)
}

// readImageStamp reads the stamp of the image in dir; an image made before
// stamps existed has none (zero stamp, no error).
func readImageStamp(dir string) (imageStamp, error) {
	var st imageStamp
	b, err := os.ReadFile(filepath.Join(dir, imageStampFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil || st.RunscSHA256 == "" {
		return st, fmt.Errorf("gvisor: %s in the checkpoint image is unreadable", imageStampFile)
	}
	return st, nil
}

// checkImageStamp refuses an image made by another runsc binary. An image
// without a stamp is let through: runsc's own checks are all there is for it.
func (d *Driver) checkImageStamp(st imageStamp) error {
	if st.RunscSHA256 == "" {
		return nil
	}
	sum, err := d.runscSHA256()
	if err != nil {
		return fmt.Errorf("gvisor: runsc digest: %w", err)
	}
	if st.RunscSHA256 != sum {
		return errdefs.Conflict("gvisor: the checkpoint was made by another runsc build (sha256 %.12s…, this server runs %.12s…); "+
			"gVisor restores a checkpoint only with the runsc that made it: create from a files snapshot instead", st.RunscSHA256, sum)
	}
	return nil
}

// statefileMagic begins every gVisor state file; an 8-byte big-endian
// length and that many bytes of JSON metadata (string to string) follow.
var statefileMagic = []byte("gVisorSF")

// maxStateMetadata is gVisor's own limit on the metadata section.
const maxStateMetadata = 16 << 20

// recordedSpec is what a restore takes from the container spec runsc
// recorded in a checkpoint image: runsc refuses a restore whose spec
// differs from it in these.
type recordedSpec struct {
	Mounts  []ociMount `json:"mounts"`
	Process struct {
		NoNewPrivileges bool `json:"noNewPrivileges"`
	} `json:"process"`
}

// checkpointSpec returns the container spec runsc recorded in the
// checkpoint image in dir.
func checkpointSpec(dir string) (recordedSpec, error) {
	f, err := os.Open(filepath.Join(dir, "checkpoint.img"))
	if err != nil {
		return recordedSpec{}, err
	}
	defer f.Close()
	var head [16]byte
	if _, err := io.ReadFull(f, head[:]); err != nil || !bytes.Equal(head[:8], statefileMagic) {
		return recordedSpec{}, fmt.Errorf("gvisor: checkpoint.img is not a gVisor state file")
	}
	n := binary.BigEndian.Uint64(head[8:])
	if n > maxStateMetadata {
		return recordedSpec{}, fmt.Errorf("gvisor: checkpoint.img metadata is %d bytes", n)
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(f, raw); err != nil {
		return recordedSpec{}, fmt.Errorf("gvisor: checkpoint.img metadata: %v", err)
	}
	var meta map[string]string
	if err := json.Unmarshal(raw, &meta); err != nil {
		return recordedSpec{}, fmt.Errorf("gvisor: checkpoint.img metadata: %v", err)
	}
	var specs map[string]recordedSpec
	if err := json.Unmarshal([]byte(meta["container_specs"]), &specs); err != nil || len(specs) != 1 {
		return recordedSpec{}, fmt.Errorf("gvisor: checkpoint.img records %d container specs (%v), want 1", len(specs), err)
	}
	for _, s := range specs {
		return s, nil
	}
	panic("unreachable")
}

// conformMounts lays mounts out as the checkpoint recorded them: its
// destinations, types and options in its order, each with the source this
// instance has for that destination (one it no longer has keeps the
// recorded source).
func conformMounts(mounts, recorded []ociMount) []ociMount {
	src := make(map[string]string, len(mounts))
	for _, m := range mounts {
		src[m.Destination] = m.Source
	}
	out := make([]ociMount, 0, len(recorded))
	for _, r := range recorded {
		if s, ok := src[r.Destination]; ok {
			r.Source = s
		}
		out = append(out, r)
	}
	return out
}
