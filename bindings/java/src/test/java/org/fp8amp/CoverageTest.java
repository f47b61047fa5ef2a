package org.fp8amp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.jar.JarFile;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.fp8amp.swig.Fp8amp;
import org.junit.jupiter.api.Test;

/**
 * Every function of the header is in org.fp8amp.swig.Fp8amp, except those README.md lists as not
 * wrapped; and SWIG met no pointer type it had no typemap for (it would have made a SWIGTYPE_p_*
 * class, an opaque pointer Java cannot fill). A function added to the header either works in Java
 * or fails here until it is wrapped or listed.
 */
class CoverageTest {
    /** bindings/java/README.md, "Not wrapped", and bindings/swig/fp8amp.i's %ignore list. */
    private static final Set<String> NOT_WRAPPED = Set.of(
            "fp8amp_tensor_wrap", "fp8amp_tensor_rebind", "fp8amp_tensor_data",
            "fp8amp_tensor_from_dlpack", "fp8amp_tensor_to_dlpack",
            "fp8amp_context_set_stream", "fp8amp_context_get_stream", "fp8amp_context_set_allocator",
            "fp8amp_grad_scaler_scale_device_ptr",
            "fp8amp_recipe_init", "fp8amp_recipe_init_default", "fp8amp_linear_desc_init",
            "fp8amp_linear_desc_init_default", "fp8amp_adam_desc_init", "fp8amp_adam_desc_init_default",
            "fp8amp_opt_level_adam_config", "fp8amp_adam_step_args_init",
            "fp8amp_adam_step_args_init_default", "fp8amp_grad_scaler_desc_init",
            "fp8amp_grad_scaler_desc_init_default", "fp8amp_opt_level_config",
            "fp8amp_norm_desc_init", "fp8amp_optimizer_set_shard", "fp8amp_optimizer_shard_range",
            "fp8amp_param_state_init", "fp8amp_optimizer_param_state", "fp8amp_optimizer_set_param_state",
            "fp8amp_optimizer_set_step");

    @Test
    void everyHeaderFunctionIsWrappedOrListedAsNotWrapped() throws Exception {
        String header = System.getProperty("fp8amp.header");
        assumeTrue(header != null, "run by ctest (java.junit), which passes the header's path");
        Set<String> methods = new TreeSet<>();
        for (Method m : Fp8amp.class.getDeclaredMethods()) {
            if (Modifier.isPublic(m.getModifiers()) && Modifier.isStatic(m.getModifiers())) methods.add(m.getName());
        }
        Pattern declaration = Pattern.compile("FP8AMP_API[^(;]*?[ (*](fp8amp_[a-z0-9_]+)\\)?\\(");
        Matcher matcher = declaration.matcher(Files.readString(Path.of(header)));
        List<String> missing = new ArrayList<>();
        int functions = 0;
        while (matcher.find()) {
            String name = matcher.group(1);
            ++functions;
            boolean wrapped = methods.contains(name.substring("fp8amp_".length()));
            boolean listed = NOT_WRAPPED.contains(name) || name.startsWith("fp8amp_comm_");
            if (wrapped == listed) missing.add(name + (wrapped ? " (wrapped, but listed as not wrapped)" : ""));
        }
        assertTrue(functions > 80, "found only " + functions + " declarations in " + header);
        assertEquals(Collections.emptyList(), missing, "functions neither wrapped nor listed in README.md's 'Not wrapped'");
    }

    @Test
    void swigMetNoPointerWithoutATypemap() throws Exception {
        Path jar = Path.of(Fp8amp.class.getProtectionDomain().getCodeSource().getLocation().toURI());
        assumeTrue(jar.toString().endsWith(".jar"), "Fp8amp loaded from a jar");
        List<String> opaque = new ArrayList<>();
        try (JarFile file = new JarFile(jar.toFile())) {
            file.stream().map(e -> e.getName()).filter(n -> n.contains("SWIGTYPE_")).forEach(opaque::add);
        }
        assertEquals(Collections.emptyList(), opaque, "pointer types SWIG had no typemap for");
    }
}
