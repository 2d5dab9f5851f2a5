// Binary containerd-shim-runsc-v1 is gVisor's containerd shim, built from the
// pinned gvisor.dev/gvisor module with a project-owned main package.
//
// It mirrors two upstream files at the version pinned in ../../go.mod:
//   - gvisor.dev/gvisor/shim/main.go (with shim/v1/cli/cli.go, the main it calls):
//     shim.Run with gVisor's shim manager and its task service plugin;
//   - gvisor.dev/gvisor/pkg/shim/v1/manager.go: manager.Start is copied below,
//     together with the unexported pieces it needs (newCommand, the grouping
//     annotation keys, the "address" file name). Name, Stop, Info and the whole
//     long-lived shim (the task service) stay gVisor's own code.
//
// Why it exists: the upstream shim fails on our hosts (Debian 12, containerd
// 1.6.20, root without CAP_SYS_RESOURCE) on two points, both confined to the
// short-lived "start" invocation that containerd runs to spawn a shim:
//
//  1. "start" prints the shim's socket address as plain text. gVisor's shim is
//     built on containerd 2's shim library, which prints a JSON document
//     ({"version":2,"address":...,"protocol":"ttrpc"}); containerd 1.6 takes the
//     whole output (stdout and stderr) as the address and fails with
//     "dial unix {...}: connect: invalid argument". containerd 1.7 and 2.x
//     accept a plain address as well, so this wrapper works with them too.
//
//  2. It tolerates not being allowed to lower its own oom_score_adj. gVisor's
//     manager.Start sets the long-lived shim to -999 and fails the whole start
//     when the write is refused; lowering oom_score_adj needs CAP_SYS_RESOURCE,
//     so every container failed with "failed to set OOM Score on shim: write
//     /proc/N/oom_score_adj: permission denied". Here the permission error is
//     ignored and the shim keeps containerd's score, as containerd's runc shim
//     does.
//
// When the pin in go.mod moves: diff pkg/shim/v1/manager.go (Start, newCommand,
// resolveGrouping) and shim/v1/cli/cli.go against this file and carry the
// changes over; `sandman cluster build` rebuilds the set under the new version.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/sys"
	"golang.org/x/sys/unix"
	gvshim "gvisor.dev/gvisor/pkg/shim/v1"
	_ "gvisor.dev/gvisor/pkg/shim/v1/plugin" // registers the runsc task service
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"
)

const (
	runtimeName   = "io.containerd.runsc.v1"
	oomScoreShim  = -999 // what gVisor asks for
	groupAnnoCRI  = "io.kubernetes.cri.sandbox-id"
	groupAnnoCRIO = "io.kubernetes.cri-o.SandboxID"
	addressFile   = "address"
)

type manager struct {
	shim.Manager // gVisor's: Name, Stop, Info
}

func main() {
	m := manager{gvshim.NewShimManager(runtimeName)}
	// containerd (1.6 and 2.x alike) runs "... -id ID start": the action is last.
	if len(os.Args) < 2 || os.Args[len(os.Args)-1] != "start" {
		shim.Run(context.Background(), m)
		return
	}
	// Let the library write its JSON to a file, then print only the address.
	// The file goes in the working directory, the task's bundle, which
	// containerd removes with the task even if Run exits early.
	stdout := os.Stdout
	tmp, err := os.CreateTemp(".", ".shim-start-*")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s", runtimeName, err)
		os.Exit(1)
	}
	os.Stdout = tmp
	shim.Run(context.Background(), m) // exits non-zero by itself on failure
	os.Stdout = stdout
	out, err := os.ReadFile(tmp.Name())
	tmp.Close()
	os.Remove(tmp.Name())
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s", runtimeName, err)
		os.Exit(1)
	}
	var p shim.BootstrapParams
	if json.Unmarshal(out, &p) == nil && p.Address != "" {
		out = []byte(p.Address)
	}
	stdout.Write(out)
}

func grouping(id string) (string, error) {
	opts := runsc.GetRuntimeOptions()
	if opts == nil || !opts.Grouping {
		return id, nil
	}
	data, err := os.ReadFile("config.json")
	if err != nil {
		return "", fmt.Errorf("failed to read config.json when starting shim: %w", err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", err
	}
	for _, k := range []string{groupAnnoCRI, groupAnnoCRIO} {
		if g, ok := spec.Annotations[k]; ok {
			return g, nil
		}
	}
	return id, nil
}

func newCommand(ctx context.Context, id, containerdAddress string, debug bool) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-address", containerdAddress, "-id", id}
	if debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	return cmd, nil
}

func (m manager) Start(ctx context.Context, id string, opts shim.StartOpts) (_ shim.BootstrapParams, retErr error) {
	params := func(address string) shim.BootstrapParams {
		return shim.BootstrapParams{Version: 2, Address: address, Protocol: "ttrpc"}
	}
	group, err := grouping(id)
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	cmd, err := newCommand(ctx, id, opts.Address, opts.Debug)
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	address, err := shim.SocketAddress(ctx, opts.Address, group, opts.Debug)
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return shim.BootstrapParams{}, fmt.Errorf("create new shim socket: %w", err)
		}
		if shim.CanConnect(address) { // grouping: reuse the sandbox's shim
			if err := os.WriteFile(addressFile, []byte(address), 0o644); err != nil {
				return shim.BootstrapParams{}, fmt.Errorf("write existing socket for shim: %w", err)
			}
			return params(address), nil
		}
		if err := shim.RemoveSocket(address); err != nil {
			return shim.BootstrapParams{}, fmt.Errorf("remove pre-existing socket: %w", err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return shim.BootstrapParams{}, fmt.Errorf("try create new shim socket 2x: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			_ = shim.RemoveSocket(address)
			if cmd.Process != nil {
				cmd.Process.Kill()
			}
		}
	}()
	if err := os.WriteFile(addressFile, []byte(address), 0o644); err != nil {
		return shim.BootstrapParams{}, err
	}
	f, err := socket.File()
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	if err := cmd.Start(); err != nil {
		f.Close()
		return shim.BootstrapParams{}, err
	}
	go cmd.Wait()
	if err := shim.WritePidFile("shim.pid", cmd.Process.Pid); err != nil {
		return shim.BootstrapParams{}, err
	}
	if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreShim); err != nil {
		if !errors.Is(err, os.ErrPermission) {
			return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)
		}
		// No CAP_SYS_RESOURCE: keep the score inherited from containerd. Say
		// nothing: containerd 1.6 reads stdout and stderr together as the address.
	}
	return params(address), nil
}
