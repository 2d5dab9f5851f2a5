// A minimal compiled daemon, for `sandman bench daemon` only: what the
// Python daemon's start-up, memory, disk and exec latency would be if it were
// a static Go binary. It serves the same JSON shapes for GET /healthz and
// POST /v1/exec of an argv (bearer token checked against its SHA-256, output
// captured, exit code exact), and nothing else: no sessions, files, reset,
// streaming or PID 1 reaping of orphans. Not a product; a measuring stick.
//
// Build: CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o minidaemon .
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

type execRequest struct {
	Cmd      []string          `json:"cmd"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	TimeoutS float64           `json:"timeout_s,omitempty"`
}

type execResult struct {
	ExitCode       int     `json:"exit_code"`
	Stdout         string  `json:"stdout"`
	Stderr         string  `json:"stderr"`
	StdoutEncoding string  `json:"stdout_encoding"`
	StderrEncoding string  `json:"stderr_encoding"`
	TimedOut       bool    `json:"timed_out"`
	Truncated      bool    `json:"truncated"`
	DurationMs     float64 `json:"duration_ms"`
}

func encode(b []byte) (string, string) {
	if utf8.Valid(b) {
		return string(b), "utf-8"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

func jsonError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func main() {
	listen := flag.String("listen", "127.0.0.1:7878", "HOST:PORT")
	flag.Parse()
	want := os.Getenv("SANDMAN_TOKEN_SHA256")
	baseEnv := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SANDMAN_TOKEN") {
			baseEnv = append(baseEnv, kv)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok": true}`))
	})
	mux.HandleFunc("/v1/exec", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			jsonError(w, 405, "method_not_allowed", "POST only")
			return
		}
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(tok))
		if want == "" || subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(want)) != 1 {
			jsonError(w, 401, "unauthorized", "invalid token")
			return
		}
		var req execRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || len(req.Cmd) == 0 {
			jsonError(w, 400, "bad_request", fmt.Sprintf("exec: %v", err))
			return
		}
		timeout := 600 * time.Second
		if req.TimeoutS > 0 {
			timeout = time.Duration(req.TimeoutS * float64(time.Second))
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		t0 := time.Now()
		cmd := exec.CommandContext(ctx, req.Cmd[0], req.Cmd[1:]...)
		cmd.Dir = req.Cwd
		cmd.Env = append([]string{}, baseEnv...)
		for k, v := range req.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					code = -int(ws.Signal())
				} else {
					code = ee.ExitCode()
				}
			} else {
				jsonError(w, 400, "cannot_start", err.Error())
				return
			}
		}
		res := execResult{ExitCode: code, TimedOut: ctx.Err() == context.DeadlineExceeded}
		res.Stdout, res.StdoutEncoding = encode(out.Bytes())
		res.Stderr, res.StderrEncoding = encode(errb.Bytes())
		res.DurationMs = float64(time.Since(t0).Microseconds()) / 1000
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(res)
	})
	srv := &http.Server{Addr: *listen, Handler: mux}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
