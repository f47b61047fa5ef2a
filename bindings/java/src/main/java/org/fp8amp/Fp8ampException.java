package org.fp8amp;

import org.fp8amp.swig.Status;

/**
 * A failed fp8amp call: the C function's status and the library's message
 * ({@code fp8amp_last_error_message()}, read on the calling thread right after the call), e.g.
 * {@code FP8AMP_ERROR_SHAPE_MISMATCH: fp8amp_tensor_copy_from_host: nbytes 12 differs from ...}.
 * A failed call changes nothing (the C contract), so the objects involved stay usable.
 * Thrown by the generated layer ({@code org.fp8amp.swig.Fp8amp}) and by every class of this package.
 */
public class Fp8ampException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final int statusCode;
    private final String libraryMessage;

    /** Called from the JNI wrapper with the status and the library's message. */
    public Fp8ampException(int statusCode, String libraryMessage) {
        super(statusName(statusCode) + ": " + libraryMessage);
        this.statusCode = statusCode;
        this.libraryMessage = libraryMessage;
    }

    /** The status as the generated enum, or null for a value this binding does not know (a newer library). */
    public Status status() {
        try {
            return Status.swigToEnum(statusCode);
        } catch (IllegalArgumentException e) {
            return null;
        }
    }

    /** The status's C value ({@code fp8amp_status}). */
    public int statusCode() {
        return statusCode;
    }

    /** The library's message alone, "function: what is wrong". */
    public String libraryMessage() {
        return libraryMessage;
    }

    /** "FP8AMP_ERROR_SHAPE_MISMATCH" for a status value, as {@code fp8amp_status_name} spells it. */
    public static String statusName(int statusCode) {
        try {
            return "FP8AMP_" + Status.swigToEnum(statusCode).name();
        } catch (IllegalArgumentException e) {
            return "FP8AMP_UNKNOWN_STATUS";
        }
    }
}
