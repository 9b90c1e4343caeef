package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestKernelInitLine runs each kernel driver on the host (python3 and
// node, as in the templates) with an identity line between two
// executions, as the agent writes it to a kernel's copy in a fork's child:
// the line is no execution (the counts go 1, 2 and no message answers
// it), and its env is the kernel's from then on. A kernel that took it
// for a cell answered with an execution of its own, which the facade read
// as the next cell's (TestE2BAcrossRestart's fork saw no result).
func TestKernelInitLine(t *testing.T) {
	for _, tc := range []struct {
		language      string
		first, second string
		want          string // in the second execution's messages
	}{
		{"python", "x = 1", "import os\nf\"{x} {os.environ['SPACE_T']}\"", `"text": "1 child"`},
		{"javascript", "globalThis.x = 1", "`${x} ${process.env.SPACE_T}`", `"text":"1 child"`},
		{"bash", "X=1", `echo "$X $SPACE_T"`, `"text": "1 child\n"`},
	} {
		t.Run(tc.language, func(t *testing.T) {
			dir, argv := kernelFiles(t, tc.language)
			var in bytes.Buffer
			for _, l := range []any{
				map[string]any{"code": tc.first},
				map[string]any{"init": map[string]any{"env": map[string]string{"SPACE_T": "child", "bad name": "x"}}},
				map[string]any{"code": tc.second},
			} {
				b, _ := json.Marshal(l)
				in.Write(append(b, '\n'))
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "SPACE_T=pool")
			cmd.Stdin = &in
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v: %v\nstderr: %s", argv, err, stderr.Bytes())
			}
			var execs [][]string // each execution's messages
			for _, l := range strings.Split(string(out), "\n") {
				_, msg, ok := strings.Cut(l, string(rune(msgMark)))
				if !ok {
					continue
				}
				var head struct {
					Type  string `json:"type"`
					Count int    `json:"execution_count"`
				}
				if err := json.Unmarshal([]byte(msg), &head); err != nil {
					t.Fatalf("message %q: %v", msg, err)
				}
				if head.Type == "number_of_executions" {
					if head.Count != len(execs)+1 {
						t.Errorf("execution_count %d, want %d", head.Count, len(execs)+1)
					}
					execs = append(execs, nil)
					continue
				}
				if len(execs) == 0 {
					t.Fatalf("message %q before any execution", msg)
				}
				execs[len(execs)-1] = append(execs[len(execs)-1], msg)
			}
			if len(execs) != 2 {
				t.Fatalf("%d executions, want 2 (the identity line is none): %q", len(execs), out)
			}
			second := strings.Join(execs[1], "\n")
			if !strings.Contains(second, tc.want) || strings.Contains(second, `"error"`) {
				t.Errorf("second execution: %s\nwant %s in it and no error (stderr: %s)", second, tc.want, stderr.Bytes())
			}
		})
	}
}
