// Package agentproto defines the wire contract between the host (agentclient)
// and the guest agent (space-agent).
//
// Transport: the guest agent keeps one byte stream to the host (per driver: a
// host unix socket for gVisor, virtio-serial for QEMU, vsock for
// Firecracker). The stream carries a yamux session; the host opens one yamux
// stream per request and speaks HTTP/1.1 on it. The agent is the HTTP server.
// Bodies are JSON unless noted; long-lived responses are NDJSON streams (one
// JSON object per line). Errors are JSON Error bodies with the HTTP status of
// the errdefs class named by Error.Code.
//
// This package imports only the standard library so the agent stays small.
package agentproto

import (
	"strconv"
	"strings"
	"time"
)

// Version is the protocol version reported by the agent in Info.
// 2: Info carries the SandboxID of the last Init.
// 3: GET /v1/stats.
// 4: ?nofollow=1 on file writes and mkdir (no symbolic link in the path is
// followed: restores use it).
// 5: POST /v1/connect (a TCP connection to a port of the sandbox).
// 6: StartRequest.InitStdin and InitRequest.KeepPrestarted (a warm pool's
// prestarted processes).
// 7: StartRequest.InitDiscard (what a prestarted process leaves behind,
// removed when the claim does not keep it) and StartRequest.FollowInit.
// 8: ?nofollow=1 on file removes (restores use it: a removal is not sent
// through a symbolic link either).
// 9: the agent answers the host's challenge on every connection when it
// was given a secret (--auth-file; auth.go).
const Version = "9"

// Paths served by the agent.
const (
	PathInfo       = "/v1/info"                   // GET → Info
	PathInit       = "/v1/init"                   // POST InitRequest → 204
	PathProcesses  = "/v1/processes"              // GET → []Process; POST StartRequest → StartResponse
	PathProcess    = "/v1/processes/{pid}"        // GET → Process
	PathEvents     = "/v1/processes/{pid}/events" // GET ?from=<seq> → NDJSON Event stream until exit (or ?follow=0 for what is buffered)
	PathStdin      = "/v1/processes/{pid}/stdin"  // POST raw body → 204; ?eof=1 closes stdin after the body
	PathSignal     = "/v1/processes/{pid}/signal" // POST SignalRequest → 204
	PathResize     = "/v1/processes/{pid}/resize" // POST ResizeRequest → 204 (PTY processes only)
	PathFiles      = "/v1/files"                  // GET ?path= raw bytes; PUT ?path=&mode=&user= raw body → FileInfo; DELETE ?path=&recursive=1 → 204
	PathFilesStat  = "/v1/files/stat"             // GET ?path= → FileInfo
	PathFilesList  = "/v1/files/list"             // GET ?path=&depth= → []FileInfo
	PathFilesMkdir = "/v1/files/mkdir"            // POST ?path=&user= → FileInfo (creates parents; 409 if a non-directory exists)
	PathFilesMove  = "/v1/files/move"             // POST MoveRequest → FileInfo
	// POST ?path=&target=&user= → FileInfo: a symbolic link at path (one
	// already there is replaced), no link in path's directories followed
	// (version 4).
	PathFilesSymlink = "/v1/files/symlink"
	PathFilesWatch   = "/v1/files/watch"    // GET ?path=&recursive=1 → NDJSON WatchEvent stream
	PathReclaim      = "/v1/memory/reclaim" // POST → ReclaimResponse (kills the process using the most memory)
	PathWarmup       = "/v1/warmup"         // POST → 204 (runs what a first command would pay for; leaves no process behind)
	PathStats        = "/v1/stats"          // GET ?files_over=<bytes>&cpu=0 → Stats (version ≥ 3)
	// POST ?port=N → "HTTP/1.1 200" and then the stream is a TCP connection
	// to port N on the sandbox's loopback (version 5); an Error when
	// nothing listens there (503) or the port is the agent's own (403).
	PathConnect = "/v1/connect"
)

// ReclaimResponse names the process the agent killed to free memory when
// the sandbox reached its memory limit (PID 0: there was none to kill).
type ReclaimResponse struct {
	PID int    `json:"pid"`
	Cmd string `json:"cmd,omitempty"`
	RSS int64  `json:"rss_bytes,omitempty"` // its resident memory when killed
}

// Stats is what the guest reports about its resources. Nothing here is
// sampled in the background: CPU use is measured between two Stats calls
// (over the last 100 ms when there was none in the last minute).
type Stats struct {
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"` // share of all the guest's CPUs busy, 0–100
	MemTotal   int64   `json:"mem_total"`    // bytes (/proc/meminfo)
	MemUsed    int64   `json:"mem_used"`     // MemTotal − MemAvailable
	MemCache   int64   `json:"mem_cache"`    // Cached
	// DiskTotal and DiskUsed are statfs of the root filesystem: under gVisor
	// the writable layer's size limit and what it holds.
	DiskTotal int64 `json:"disk_total"`
	DiskUsed  int64 `json:"disk_used"`
	// LargeFiles, asked for with files_over, are regular files on the root
	// filesystem larger than that many bytes (their logical size: a sparse
	// file counts whole), the first few found.
	LargeFiles []FileSize `json:"large_files,omitempty"`
}

// FileSize is a file and its size in bytes.
type FileSize struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// ParseMeminfo reads /proc/meminfo's text into bytes per field.
func ParseMeminfo(s string) map[string]int64 {
	m := map[string]int64{}
	for line := range strings.SplitSeq(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		m[k] = n
	}
	return m
}

// Info describes the agent and the guest it runs in.
type Info struct {
	Version  string `json:"version"`  // agentproto.Version
	Kernel   string `json:"kernel"`   // uname release inside the guest
	Hostname string `json:"hostname"` // guest hostname
	PID      int    `json:"pid"`      // the agent's own pid (1 when it is init)
	// SandboxID is the id of the last Init ("" before any; version ≥ 2).
	SandboxID string `json:"sandbox_id,omitempty"`
}

// InitRequest gives a sandbox its identity. It is sent once after start (and
// again after a restore or fork, with the new identity). Env is merged into
// the default environment of every process started afterwards.
type InitRequest struct {
	SandboxID string            `json:"sandbox_id"`
	Hostname  string            `json:"hostname,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// Time, when set, steps the guest clock (used after restore on VMs).
	Time time.Time `json:"time,omitempty"`
	// Seed, when set, is mixed into the guest's entropy pool.
	Seed []byte `json:"seed,omitempty"`
	// Entropy, when set, is fresh host randomness (64 bytes from
	// crypto/rand) that the agent credits to the guest kernel's pool
	// (RNDADDENTROPY) before forcing a reseed of its CRNG (RNDRESEEDCRNG):
	// VMs restored from one memory image start with the same RNG state,
	// and only a reseed makes their output differ at once. In a VM any
	// failure fails the Init; where the kernel has no such ioctl (gVisor,
	// whose RNG is the host's) it is skipped.
	Entropy []byte `json:"entropy,omitempty"`
	// Egress, when set, turns on the sandbox's only way out: a local
	// proxy endpoint whose connections the agent tunnels to the host.
	Egress *EgressInit `json:"egress,omitempty"`
	// KeepPrestarted decides the fate of the processes started with
	// StartRequest.InitStdin before this Init (a warm pool's prestarted
	// code-interpreter kernel): when true each gets this Init's Env on its
	// stdin as one JSON line, InitLine, before the Init is answered; when
	// false they are killed and forgotten, so a sandbox holds only what its
	// owner starts. Either way it happens once, at the first Init with a
	// SandboxID (the identity) after the process started.
	KeepPrestarted bool `json:"keep_prestarted,omitempty"`
}

// InitLine is the line a process started with StartRequest.InitStdin reads
// on its stdin when the sandbox gets its identity: the environment every
// process started from then on gets, which it must apply to itself.
type InitLine struct {
	Init struct {
		Env map[string]string `json:"env"`
	} `json:"init"`
}

// EgressInit configures the in-sandbox end of the egress tunnel.
type EgressInit struct {
	// Listen is the loopback address processes reach the proxy at
	// ("127.0.0.1:3128"); HTTP(S)_PROXY in Env point there.
	Listen string `json:"listen"`
	// CACertPEM is the sandbox's own egress CA certificate (never its
	// key), added to the system trust store for TLS interception.
	CACertPEM string `json:"ca_cert_pem,omitempty"`
}

// Agent-initiated streams: the agent opens a yamux stream to the host and
// writes one line naming its kind, then the stream carries raw bytes.
const (
	StreamEgress = "egress" // one TCP connection to the egress proxy
)

// StartRequest starts a process. Exactly one of Cmd and Shell is set: Cmd is
// an argv executed directly (Cmd[0] looked up in PATH), Shell is run with
// /bin/bash -lc (or /bin/sh -c when bash is missing).
type StartRequest struct {
	Cmd   []string          `json:"cmd,omitempty"`
	Shell string            `json:"shell,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`  // default: the user's home directory
	User  string            `json:"user,omitempty"` // default "user"; "root" allowed
	// Stdin: when true the process's stdin stays open for PathStdin writes;
	// otherwise stdin is /dev/null (after StdinData, if any, is written).
	Stdin     bool   `json:"stdin,omitempty"`
	StdinData []byte `json:"stdin_data,omitempty"`
	// TimeoutMS kills the process group (SIGKILL) after this many
	// milliseconds; 0 means no timeout.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Tag is an opaque label kept with the process (listed by PathProcesses).
	Tag string `json:"tag,omitempty"`
	// PTY, when set, runs the process on a pseudo-terminal; output arrives
	// as stdout events.
	PTY *PTYSize `json:"pty,omitempty"`
	// InitStdin marks a process started before the sandbox has its
	// identity (a warm pool's, ahead of a claim): the next Init that
	// gives one either writes an InitLine to its stdin (Stdin must be set)
	// or kills it; see InitRequest.KeepPrestarted.
	InitStdin bool `json:"init_stdin,omitempty"`
	// InitDiscard, with InitStdin, are absolute paths (files or whole
	// directories) made for the process ahead of the claim: the Init that
	// kills it removes them too, so an owner who did not keep it finds
	// nothing of it on disk either.
	InitDiscard []string `json:"init_discard,omitempty"`
	// FollowInit marks a process that applies the identity's environment
	// to itself (the code interpreter's kernels): every later Init that
	// gives an identity (a fork's child, a sandbox made from a checkpoint)
	// writes its Env to the process's stdin as one InitLine (Stdin must
	// be set), so the copy in the child runs with the child's env and
	// secret placeholders, not its parent's. A kept InitStdin process
	// follows later Inits too.
	FollowInit bool `json:"follow_init,omitempty"`
}

// PTYSize is a terminal size.
type PTYSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// StartResponse answers StartRequest.
type StartResponse struct {
	PID int `json:"pid"`
}

// Event kinds.
const (
	EventStart     = "start"     // Event.PID set
	EventStdout    = "stdout"    // Event.Data set
	EventStderr    = "stderr"    // Event.Data set
	EventExit      = "exit"      // Event.ExitCode (and Signal when killed by one) set
	EventTruncated = "truncated" // events before Event.Seq were dropped from the buffer
)

// Event is one item of a process's output stream. Seq numbers start at 1 and
// increase by one per event of that process; a client re-attaches with
// ?from=<last seq seen + 1>.
type Event struct {
	Seq      uint64    `json:"seq"`
	Type     string    `json:"type"`
	Time     time.Time `json:"time"`
	PID      int       `json:"pid,omitempty"`
	Data     []byte    `json:"data,omitempty"` // base64 in JSON
	ExitCode *int      `json:"exit_code,omitempty"`
	Signal   string    `json:"signal,omitempty"` // e.g. "SIGKILL"
	Error    string    `json:"error,omitempty"`  // set on exit when the process could not be run or timed out
}

// Process describes a process started through the agent.
type Process struct {
	PID       int        `json:"pid"`
	Cmd       []string   `json:"cmd"`
	Tag       string     `json:"tag,omitempty"`
	User      string     `json:"user"`
	Cwd       string     `json:"cwd"`
	PTY       bool       `json:"pty,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	Running   bool       `json:"running"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Signal    string     `json:"signal,omitempty"`
	ExitedAt  *time.Time `json:"exited_at,omitempty"`
}

// SignalRequest sends a signal to a process's group.
type SignalRequest struct {
	Signal string `json:"signal"` // "SIGTERM", "TERM", "9", …
}

// ResizeRequest resizes a PTY process's terminal.
type ResizeRequest = PTYSize

// MoveRequest renames From to To (parents of To are created).
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	User string `json:"user,omitempty"`
}

// FileInfo describes one file.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	Owner   string    `json:"owner,omitempty"`
	ModTime time.Time `json:"mtime"`
	Target  string    `json:"target,omitempty"` // symlink target
}

// WatchEvent is one filesystem change under a watched directory.
type WatchEvent struct {
	Type string    `json:"type"` // "create", "write", "remove", "rename", "chmod"
	Path string    `json:"path"`
	Time time.Time `json:"time"`
}

// Error is the body of every non-2xx agent response.
type Error struct {
	Code    string `json:"code"` // an errdefs machine code, e.g. "not_found"
	Message string `json:"message"`
}
