package gvisor

import (
	"fmt"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/cgroup"
	"github.com/spacesandbox/space/internal/driver"
)

// Paths inside the sandbox where the driver bind-mounts host pieces.
const (
	guestAgentPath = "/.space/bin/space-agent"
	guestRunDir    = "/.space/run"
	guestSocket    = guestRunDir + "/agent.sock"
)

// ociSpec is the subset of the OCI runtime spec runsc needs. It is written by
// hand rather than importing runtime-spec to keep the dependency surface
// small; field names follow the spec exactly.
type ociSpec struct {
	OCIVersion  string            `json:"ociVersion"`
	Process     ociProcess        `json:"process"`
	Root        ociRoot           `json:"root"`
	Hostname    string            `json:"hostname"`
	Mounts      []ociMount        `json:"mounts"`
	Linux       ociLinux          `json:"linux"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ociProcess struct {
	Terminal        bool            `json:"terminal"`
	User            ociUser         `json:"user"`
	Args            []string        `json:"args"`
	Env             []string        `json:"env"`
	Cwd             string          `json:"cwd"`
	Capabilities    ociCapabilities `json:"capabilities"`
	Rlimits         []ociRlimit     `json:"rlimits,omitempty"`
	NoNewPrivileges bool            `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCapabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Permitted   []string `json:"permitted"`
	Inheritable []string `json:"inheritable"`
}

type ociRlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNamespace `json:"namespaces"`
	CgroupsPath string         `json:"cgroupsPath"`
	Resources   ociResources   `json:"resources"`
}

type ociNamespace struct {
	Type string `json:"type"`
}

type ociResources struct {
	Memory *ociMemory `json:"memory,omitempty"`
	CPU    *ociCPU    `json:"cpu,omitempty"`
	Pids   *ociPids   `json:"pids,omitempty"`
}

type ociMemory struct {
	Limit int64 `json:"limit"`
	Swap  int64 `json:"swap"`
}

type ociCPU struct {
	Shares *uint64 `json:"shares,omitempty"`
	Quota  int64   `json:"quota"`
	Period uint64  `json:"period"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

// agentCaps are the capabilities of the agent (root inside the sandbox's own
// user-space kernel). It needs SETUID/SETGID to run processes as the
// unprivileged user and CHOWN/FOWNER/DAC_OVERRIDE to manage their files; no
// raw sockets, no admin capabilities. Processes it starts as the sandbox user
// carry no capabilities at all.
var agentCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_AUDIT_WRITE", "CAP_SETFCAP", "CAP_MKNOD",
}

// nprocLimit is each user's task limit (processes and threads) inside the
// sandbox. Every task costs the sentry memory outside the guest's view: a
// fork bomb in a 256 MiB sandbox stopped it for OOM at ~300-500 tasks,
// before the host's pids limit, and with 512 tasks allowed still did; with
// three quarters of the memory in MiB (192 there, 384 in 512 MiB) the bomb
// gets EAGAIN and the sandbox lives on (root in the sandbox can end it).
// At most half the host pids limit, which counts the sentry's threads too.
func nprocLimit(s driver.Spec) uint64 {
	return uint64(min(max(s.MemoryMB*3/4, 64), max(s.PidsMax/2, 64)))
}

// buildSpec turns a driver.Spec into the OCI config runsc reads; with auth
// the agent reads its secret from agentproto.AuthFile (auth.go).
func buildSpec(s driver.Spec, hostRunDir string, auth bool) ociSpec {
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, s.Env...)
	caps := ociCapabilities{Bounding: agentCaps, Effective: agentCaps, Permitted: agentCaps}
	res := ociResources{
		Memory: &ociMemory{Limit: int64(s.MemoryMB) << 20, Swap: int64(s.MemoryMB) << 20},
		CPU:    &ociCPU{Quota: int64(s.VCPU) * 100000, Period: 100000},
		Pids:   &ociPids{Limit: int64(s.PidsMax)},
	}
	if s.LowPriority {
		// The minimum (cgroup v1 cpu.shares; runsc converts them for
		// v2); Prioritize gives the kernel's default when claimed.
		shares := uint64(cgroup.LowShares)
		res.CPU.Shares = &shares
	}
	args := []string{guestAgentPath, "--connect", "unix:" + guestSocket}
	if auth {
		args = append(args, "--auth-file", agentproto.AuthFile)
	}
	return ociSpec{
		OCIVersion: "1.0.2",
		Process: ociProcess{
			User:         ociUser{UID: 0, GID: 0},
			Args:         args,
			Env:          env,
			Cwd:          "/",
			Capabilities: caps,
			Rlimits: []ociRlimit{
				{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536},
				{Type: "RLIMIT_NPROC", Hard: nprocLimit(s), Soft: nprocLimit(s)},
			},
			// Off so that setuid programs (sudo: the sandbox user has
			// passwordless sudo, as in E2B) work inside the sandbox. It
			// is a flag of the sandbox's own kernel: root in the sandbox
			// is what the agent already is (and what a command run as
			// root gets), with the capability set above, so it changes
			// nothing at the boundary (docs/SECURITY.md).
			NoNewPrivileges: false,
		},
		Root:     ociRoot{Path: s.Rootfs, Readonly: false},
		Hostname: s.Hostname,
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			// gVisor mounts an internal tmpfs over an empty /tmp when the spec
			// has none, sized by the host: files there are the sandbox's
			// memory, so filling /tmp used to stop the whole sandbox. Half
			// of the memory, as Linux sizes a tmpfs (and Debian 13 its /tmp):
			// a full /tmp is ENOSPC, not an out-of-memory sandbox.
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%dk", s.MemoryMB*1024/2)}},
			{Destination: guestAgentPath, Type: "bind", Source: s.AgentPath, Options: []string{"rbind", "ro"}},
			{Destination: guestRunDir, Type: "bind", Source: hostRunDir, Options: []string{"rbind", "ro"}},
		},
		Linux: ociLinux{
			Namespaces: []ociNamespace{
				{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"},
			},
			CgroupsPath: fmt.Sprintf("/space/%s", s.ID),
			Resources:   res,
		},
	}
}
